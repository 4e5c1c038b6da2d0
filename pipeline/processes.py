"""Whether a process still runs: the one liveness test behind the stack's state file and
the stale shared-memory regions of killed workers."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process of this pid namespace. A zombie counts as gone:
    it runs no code and holds no port; a process we may not signal still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # exited between the signal and the read
    return stat.rpartition(")")[2].split()[:1] != ["Z"]
