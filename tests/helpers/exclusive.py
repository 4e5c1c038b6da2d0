"""Tests that measure time run alone: a readers-writer lock across pytest-xdist's processes.

The suite runs in two processes (``-n 2``), a module each at a time. Most tests wait on
servers and prove outcomes, which hold however busy the machine is; a few measure time
against a bound (a calm tenant's latency under a flood, a high-priority lane's, a stage's
exit within its drain bound, a frozen worker's lease) and would measure the other process's
load as well. Those are marked ``exclusive``: a test so marked holds the lock exclusively,
every other test holds it shared, so an exclusive test starts once the test beside it has
finished and nothing starts beside it until it has.

``fcntl.flock`` alone lets shared holders starve a waiting writer (each new test takes the
lock again before the writer gets it), so a turnstile comes first: a writer holds the
turnstile while it waits, and a reader passes through it before taking its shared lock.
Without pytest-xdist (``-n 0``) no directory is set and nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_DIR = "PIPELINE_TEST_LOCKS"
"""Environment variable: the directory of the lock files, set by the controlling process."""


@contextlib.contextmanager
def _held(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def suite_lock(*, exclusive: bool) -> Iterator[None]:
    """Hold the suite's lock for one test: alone when ``exclusive``, beside others else."""
    directory = os.environ.get(LOCK_DIR)
    if not directory:
        yield
        return
    turnstile, room = Path(directory) / "turnstile", Path(directory) / "room"
    if exclusive:
        with _held(turnstile, fcntl.LOCK_EX), _held(room, fcntl.LOCK_EX):
            yield
        return
    with _held(turnstile, fcntl.LOCK_EX):
        pass  # a writer waiting holds the turnstile: readers queue behind it
    with _held(room, fcntl.LOCK_SH):
        yield
