"""A Triton server of one test's own, for tests that stop, freeze, restart it or unload its models."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.embedded.process import SupervisedProcess
from pipeline.embedded.stack import EmbeddedStack
from pipeline.settings import S3Settings, TritonSettings
from pipeline.triton.admin import TritonAdmin


@dataclass(frozen=True)
class OwnTriton:
    """A Triton loading the session's model store; stopping it disturbs no other test."""

    process: SupervisedProcess  # stop() / start(), kill() / start(), pause() / resume()
    env: dict[str, str]  # the CLI environment given, pointed at this Triton
    settings: TritonSettings
    models: frozenset[str]  # what it served once started: heal() loads these again

    def admin(self) -> TritonAdmin:
        """The repository API of this Triton (explicit model control: load and unload)."""
        return TritonAdmin(self.settings)

    def heal(self) -> None:
        """Back to the state the next test expects, whatever the last one left: running,
        not stopped, every model of the store loaded. A fixture shared by several fault
        tests calls it before each, so one failed test does not fail the next."""
        self.process.resume()
        if not self.process.running():
            self.process.start()
        with self.admin() as admin:
            admin.wait_ready(120.0)
            ready = {e.name for e in admin.repository_index() if e.state == "READY"}
            for name in sorted(self.models - ready):
                admin.load(name)


@contextlib.contextmanager
def start_own_triton(s3: S3Settings, env: dict[str, str], log_dir: Path) -> Iterator[OwnTriton]:
    """Start the Triton; stop it on leaving."""
    with EmbeddedStack(services=("triton",), s3=s3, log_dir=log_dir) as stack:
        settings = stack.endpoints.triton
        with TritonAdmin(settings) as admin:
            models = frozenset(e.name for e in admin.repository_index() if e.state == "READY")
        env = dict(env, PIPELINE_TRITON_GRPC_URL=str(settings.grpc_url))
        yield OwnTriton(stack.processes[0], env, settings, models)
