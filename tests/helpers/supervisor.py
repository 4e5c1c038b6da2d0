"""Start a run's worker again whenever it exits, as systemd or Kubernetes would.

A worker may stop when Kafka fails it for longer than it can wait (an output not
acknowledged within the send timeout): it exits 1 with one line, having committed
nothing past its last acknowledged output, and its successor replays from there. A test
of that path plays the supervisor, and keeps what each exit said.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tests.helpers.fault_workloads import Run
from tests.helpers.topology_process import collect_outputs


@dataclass(frozen=True)
class Exit:
    code: int
    last_line: str


class Supervisor(threading.Thread):
    """Watches ``runs``' workers from a thread; :meth:`stop` ends the watch."""

    def __init__(self, runs: Sequence[Run]) -> None:
        super().__init__(name="supervisor", daemon=True)
        self.runs = runs
        self.exits: dict[str, list[Exit]] = {run.workload.kind: [] for run in runs}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2):
            for run in self.runs:
                assert run.worker.proc is not None
                code = run.worker.proc.poll()
                if code is not None:
                    lines = run.worker.log().strip().splitlines()
                    self.exits[run.workload.kind].append(Exit(code, lines[-1] if lines else ""))
                    self._restart(run)

    def _restart(self, run: Run) -> None:
        while not self._done.is_set():
            try:
                run.new_worker().start()
                return
            except AssertionError:  # it exited while starting (Kafka still away): again
                time.sleep(1)

    def until_done(self, bootstrap: str) -> None:
        """Every run's records sent and its outputs complete (its worker restarted whenever it
        exits meanwhile), then stop watching."""
        try:
            for run in self.runs:
                assert run.producer is not None
                run.producer.join(timeout=120)
                collect_outputs(bootstrap, run.topology, run.workload.done, timeout=180)
        finally:
            self.stop()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=150)
