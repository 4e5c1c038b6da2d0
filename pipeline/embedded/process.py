"""Supervised child processes: start, wait until healthy, stop without orphans.

Each service runs in its own process group (so a stop reaches its children,
e.g. Triton's Python-backend stubs) and is tied to the life of the process
that started it with ``PR_SET_PDEATHSIG``: if the supervisor dies, even by
``kill -9``, the kernel kills the service too. Output goes to one log file
per service in a shared log directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the kernel picks it)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that nothing listens on right now. Each socket stays bound
    until all are picked: ports picked one after another may repeat, since the kernel can hand
    a just-closed one out again (a CI run's Triton got one port for gRPC and metrics and
    refused to start, 2026-11-28)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


class ServiceStartError(PipelineError):
    """A service did not become healthy; the message names its log file."""


@dataclass
class SupervisedProcess:
    """One service binary run as a child process.

    ``healthy`` is polled until it returns True or ``start_timeout`` passes.
    """

    name: str
    argv: Sequence[str]
    log_dir: Path
    healthy: Callable[[], bool]
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    start_timeout: float = 60.0
    stop_timeout: float = 10.0
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.wait_healthy()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if not self.running():
                code = self._proc.returncode if self._proc else None
                self.stop()
                raise ServiceStartError(
                    f"{self.name} exited with code {code} while starting; "
                    f"last lines of {self.log_path}:\n{self.tail()}"
                )
            with contextlib.suppress(Exception):  # a health probe failing just means "not yet"
                if self.healthy():
                    return
            time.sleep(0.2)
        self.stop()
        raise ServiceStartError(
            f"{self.name} was not healthy after {self.start_timeout:.0f}s; "
            f"last lines of {self.log_path}:\n{self.tail()}"
        )

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def kill(self) -> None:
        """SIGKILL the whole process group at once, as a crash would: nothing is flushed.

        :meth:`start` brings the service back with the same arguments (same port, same
        storage), which is how fault tests restart a broker or a Triton."""
        proc = self._proc
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.stop_timeout)
        self._proc = None

    def pause(self) -> None:
        """SIGSTOP the process group: its sockets stay open but nothing answers, the way an
        overloaded or partitioned server looks to its clients (unlike a refused connection)."""
        if self._proc is not None:
            _signal_group(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self._proc is not None:
            _signal_group(self._proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after the timeout."""
        proc = self._proc
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        _signal_group(proc.pid, signal.SIGCONT)  # a paused service must see its SIGTERM now
        try:
            proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            pass
        # The group may outlive its leader (e.g. Python-backend stubs): always sweep it.
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.stop_timeout)
        self._proc = None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
