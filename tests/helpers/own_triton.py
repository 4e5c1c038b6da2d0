"""A Triton server of one test's own, for tests that stop or restart it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.embedded.process import SupervisedProcess
from pipeline.embedded.stack import EmbeddedStack
from pipeline.settings import S3Settings


@dataclass(frozen=True)
class OwnTriton:
    """A Triton loading the session's model store; stopping it disturbs no other test."""

    process: SupervisedProcess  # stop() / start() it for an outage or a restart
    env: dict[str, str]  # the CLI environment given, pointed at this Triton


@contextlib.contextmanager
def start_own_triton(s3: S3Settings, env: dict[str, str], log_dir: Path) -> Iterator[OwnTriton]:
    """Start the Triton; stop it on leaving."""
    with EmbeddedStack(services=("triton",), s3=s3, log_dir=log_dir) as stack:
        grpc_url = str(stack.endpoints.triton.grpc_url)
        yield OwnTriton(stack.processes[0], dict(env, PIPELINE_TRITON_GRPC_URL=grpc_url))
