"""``pipeline run --processes N``: N worker processes of the same consumer groups, kept running.

Each child is a plain ``python -m pipeline run ... --processes 1``: exactly the
single-process path, its own interpreter, GIL and event loop, so a host's cores
share the work through Kafka's group rebalancing, as separate machines would.
Children are started as subprocesses from an asyncio loop rather than with
:mod:`multiprocessing`: a forked child would inherit this process's imported
state (grpc does not survive ``fork``), a spawned one re-imports everything
anyway, and a subprocess can be signalled, killed and waited on without a helper
thread. Children die with the supervisor (``PR_SET_PDEATHSIG``), even on ``kill -9``.

A child that exits non-zero or is killed is started again after a delay that
doubles with each quick failure (one within ``healthy_after_s`` of its start) and
resets once a child has run that long; after ``max_quick_failures`` in a row the
supervisor gives up, stops the others and exits 1, leaving the restart to the
host's own supervisor (systemd, Kubernetes). tenacity, the project's retry
library, retries calls and has no notion of a run that was healthy for a while,
so this rule is the few lines below.

SIGTERM/SIGINT are forwarded to every child, which drains and commits (the
runner's bounded shutdown); a child still running ``stop_timeout_s`` later is
killed. The supervisor exits 0 when every child's last exit was 0.

With ``standby_argv``, one more process is kept started and waiting: it has imported
the runtime and loaded the topology (about 2 s of a child's start-up, measured
2026-11-27), and blocks reading its process index from stdin. A crashed child is
replaced by it (the index written, stdin closed), and a new standby is started behind
it; so a killed child's partitions are served again about as soon as it joins its
groups, which with static membership is at once (issue 26). A standby that gets EOF
(the supervisor stops) exits 0 without serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.embedded.process import die_with_parent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    initial_delay_s: float = 0.1
    """The first restart after a crash: soon, since a child restarted under its static group
    membership gets its partitions back as soon as it joins (about 2.2 s of start-up here,
    most of it imports); the delay doubles with each quick failure after it."""
    max_delay_s: float = 30.0
    healthy_after_s: float = 60.0
    max_quick_failures: int = 5

    def delay_s(self, quick_failures: int) -> float:
        """Before the restart that follows the ``quick_failures``-th quick failure in a row."""
        return float(min(self.max_delay_s, self.initial_delay_s * 2 ** max(0, quick_failures - 1)))

    def quick_failures(self, before: int, ran_s: float) -> int:
        """Quick failures in a row after a failure of a run that lasted ``ran_s``."""
        return before + 1 if ran_s < self.healthy_after_s else 1


class Supervisor:
    """Keeps ``count`` children running: child ``i`` runs ``argv_for(i)`` with ``env``."""

    def __init__(
        self,
        argv_for: Callable[[int], Sequence[str]],
        count: int,
        *,
        env: Mapping[str, str] | None = None,
        stop_timeout_s: float = 30.0,
        policy: RestartPolicy | None = None,
        standby_argv: Sequence[str] | None = None,
    ) -> None:
        self._argv_for, self._count = argv_for, count
        self._standby_argv = list(standby_argv) if standby_argv is not None else None
        self._standby: asyncio.subprocess.Process | None = None
        self._env = dict(env) if env is not None else None
        self._stop_timeout_s = stop_timeout_s
        self._policy = policy or RestartPolicy()
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = asyncio.Event()

    async def run(self) -> int:
        """Until every child has exited after a stop (a signal, or giving up); the exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop, sig)
        killer = asyncio.create_task(self._kill_late())
        try:
            codes = await asyncio.gather(*(self._keep(i) for i in range(self._count)), self._first_standby())
            codes = codes[: self._count]
        finally:
            killer.cancel()
            for child in self._children.values():  # only after an error of our own
                if child.returncode is None:
                    child.kill()
            await self._dismiss_standby()
        log.info("all %d processes stopped (exit codes %s)", self._count, ", ".join(map(str, codes)))
        return 0 if all(code == 0 for code in codes) else 1

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Forward ``sig`` to every child; none is restarted from now on."""
        self._stopping.set()
        if self._standby is not None and self._standby.stdin is not None:
            self._standby.stdin.close()  # EOF: it exits without serving
        for child in self._children.values():
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(sig)

    async def _keep(self, index: int) -> int:
        """Run child ``index`` until a stop; its last exit code."""
        quick = 0
        restart = False
        while True:
            started = time.monotonic()
            child = await self._take_standby(index) if restart else None
            if child is None:
                child = await asyncio.create_subprocess_exec(
                    *self._argv_for(index), env=self._env, preexec_fn=die_with_parent
                )
                log.info("process %d started (pid %d)", index + 1, child.pid)
            restart = True
            self._children[index] = child
            if self._stopping.is_set():  # the signal came while it was being started
                child.send_signal(signal.SIGTERM)
            code = await child.wait()
            ran_s = time.monotonic() - started
            if self._stopping.is_set() or code == 0:
                log.info("process %d (pid %d) exited with %d", index + 1, child.pid, code)
                return code
            quick = self._policy.quick_failures(quick, ran_s)
            if quick > self._policy.max_quick_failures:
                log.error(
                    "process %d failed %d times in a row, each within %.0fs of its start: giving up",
                    index + 1, quick, self._policy.healthy_after_s,
                )
                self.stop()
                return code
            delay = self._policy.delay_s(quick)
            log.warning(
                "process %d (pid %d) exited with %d after %.1fs; restarting in %.1fs",
                index + 1, child.pid, code, ran_s, delay,
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self._stopping.is_set():
                return code

    async def _first_standby(self) -> int:
        """Start the first standby once the children have had a moment to start (they come
        first); returns 0 to stand beside the children's exit codes."""
        if self._standby_argv is not None:
            await asyncio.sleep(0.5)
            if not self._stopping.is_set():
                await self._start_standby()
        return 0

    async def _start_standby(self) -> None:
        assert self._standby_argv is not None
        self._standby = await asyncio.create_subprocess_exec(
            *self._standby_argv, env=self._env, stdin=asyncio.subprocess.PIPE, preexec_fn=die_with_parent
        )
        log.debug("standby started (pid %d)", self._standby.pid)

    async def _take_standby(self, index: int) -> asyncio.subprocess.Process | None:
        """The standby, told it is process ``index`` now (a new one started behind it); None
        when there is none alive to take."""
        standby, self._standby = self._standby, None
        if standby is None or standby.returncode is not None or standby.stdin is None:
            return None
        try:
            standby.stdin.write(f"{index}\n".encode())
            await standby.stdin.drain()
            standby.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            return None  # it died meanwhile: a fresh start instead
        log.info("process %d started (pid %d, the standby)", index + 1, standby.pid)
        if not self._stopping.is_set():
            await self._start_standby()
        return standby

    async def _dismiss_standby(self) -> None:
        standby, self._standby = self._standby, None
        if standby is None or standby.returncode is not None:
            return
        if standby.stdin is not None and not standby.stdin.is_closing():
            standby.stdin.close()
        try:
            await asyncio.wait_for(standby.wait(), 5.0)
        except asyncio.TimeoutError:
            standby.kill()
            await standby.wait()

    async def _kill_late(self) -> None:
        """After a stop, kill what still runs ``stop_timeout_s`` later (its drain is over)."""
        await self._stopping.wait()
        await asyncio.sleep(self._stop_timeout_s)
        for index, child in self._children.items():
            if child.returncode is None:
                log.error("process %d (pid %d) still running %.0fs after the stop: killed",
                          index + 1, child.pid, self._stop_timeout_s)
                child.kill()
