"""Errors a user can act on.

The CLI prints a :class:`PipelineError` as one line and exits non-zero;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PipelineError(Exception):
    """An error caused by input or environment, with a message meant for a person."""


class ConfigError(PipelineError):
    """A configuration file, flag or environment variable is wrong."""


class EndpointUnreachable(PipelineError):
    """A configured service (Kafka, Triton, S3) did not answer."""


class AccessDenied(PipelineError):
    """A service authenticated this process and refused it an operation (a Kafka ACL)."""
