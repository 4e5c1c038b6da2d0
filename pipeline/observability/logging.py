"""The one logging setup of a worker process: our loggers at the chosen level, libraries quiet.

Why: ``logging.basicConfig(level=...)`` applied the chosen level to every logger,
so a normal ``pipeline run`` console was flooded with aiokafka's group-coordinator
INFO lines (and grpc's, botocore's...). Here the root logger, which every
library's logger inherits from, stays at WARNING (or above, with
``--log-level error``) and only our own packages (``pipeline``, ``workers``) follow
``--log-level``; ``debug`` opens everything, libraries included, for a person
chasing a problem.

``--log-format json`` writes one JSON object per line (``timestamp``, ``level``,
``logger``, ``message``, ``exception`` when there is one, and any ``extra`` fields),
for log shippers. The formatter is python-json-logger's: it already handles
``extra`` fields, exceptions and stack traces, and non-serialisable values. A
line logged while a span is current also carries ``trace_id`` and ``span_id``
(hex, as trace backends show them), so a log search and a trace meet.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

from pipeline.errors import ConfigError

OUR_LOGGERS = ("pipeline", "workers")
LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True)
class LogSettings:
    """``--log-level`` and ``--log-format``, checked."""

    level: str = "info"
    format: str = "text"

    def __post_init__(self) -> None:
        if self.level.lower() not in LEVELS:
            raise ConfigError(f"unknown log level {self.level!r}: one of {', '.join(LEVELS)}")
        if self.format not in FORMATS:
            raise ConfigError(f"unknown log format {self.format!r}: one of {', '.join(FORMATS)}")

    @property
    def our_level(self) -> int:
        return int(getattr(logging, self.level.upper()))

    @property
    def library_level(self) -> int:
        """Libraries: everything with ``debug``, else WARNING at least."""
        return logging.DEBUG if self.our_level == logging.DEBUG else max(self.our_level, logging.WARNING)

    @property
    def json(self) -> bool:
        return self.format == "json"


class TraceJsonFormatter(JsonFormatter):
    """python-json-logger's formatter plus the current span's ids, when there is one."""

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        super().add_fields(log_data, record, message_dict)
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            log_data["trace_id"] = trace.format_trace_id(context.trace_id)
            log_data["span_id"] = trace.format_span_id(context.span_id)


def formatter(settings: LogSettings) -> logging.Formatter:
    if settings.json:
        return TraceJsonFormatter(
            "{levelname}{name}{message}",
            style="{",
            rename_fields={"levelname": "level", "name": "logger", "exc_info": "exception"},
            timestamp=True,
        )
    return logging.Formatter(TEXT_FORMAT)


def configure_logging(settings: LogSettings, stream: TextIO | None = None) -> None:
    """Replace the root logger's handlers with one on ``stream`` (stderr) in the chosen format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(settings))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.library_level)
    for name in OUR_LOGGERS:
        logging.getLogger(name).setLevel(settings.our_level)
