"""Ctrl-C and SIGTERM as a request to finish, not a traceback.

The first signal sets an :class:`asyncio.Event`: the producer stops sending and
flushes what is queued, the consumer stops reading; both still print their
summary. The handler then removes itself, so a second Ctrl-C interrupts at
once (Python's default ``KeyboardInterrupt``), for when the broker hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """Within the running loop: the first SIGINT/SIGTERM sets ``stop``."""
    loop = asyncio.get_running_loop()

    def first(signum: signal.Signals) -> None:
        stop.set()
        loop.remove_signal_handler(signum)

    for signum in _SIGNALS:
        loop.add_signal_handler(signum, first, signum)
    try:
        yield
    finally:
        for signum in _SIGNALS:
            loop.remove_signal_handler(signum)
