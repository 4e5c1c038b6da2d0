"""Send-rate pacing that stays accurate at thousands of records per second.

Sleeping ``1/rate`` between sends drifts: every ``asyncio.sleep`` overshoots
(the event loop's timer resolution is about a millisecond), so at 2000/s a
naive loop reaches maybe half the rate. :class:`Pacer` instead keeps an
absolute schedule (the generic cell rate algorithm, a token bucket written as
"the time the next token is due"): an overshoot is paid back by sending the
next few records without sleeping, so the *average* rate is exact.

The bucket holds at most ``burst`` tokens. That bounds how much a stall (a
slow broker, a paused laptop) can be made up for in one go: after a long
stall the schedule restarts rather than firing a flood.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class Pacer:
    """Await :meth:`wait` before each send to hold ``rate`` sends per second; rate 0 = unpaced."""

    def __init__(
        self,
        rate: float,
        *,
        burst: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if rate < 0:
            raise ValueError("rate must be >= 0")
        self.rate = rate
        self._interval = 1.0 / rate if rate else 0.0
        # Default: 20 ms of tokens (at least 1): absorbs timer overshoot without visible bursts.
        self.burst = burst if burst is not None else max(1, int(rate * 0.02))
        self._clock = clock
        self._sleep = sleep
        self._due: float | None = None

    async def wait(self) -> None:
        """Return when the next send is due (at once when unpaced or behind schedule)."""
        if not self._interval:
            return
        now = self._clock()
        if self._due is None:
            self._due = now
        # Never bank more than `burst` tokens of lag.
        self._due = max(self._due, now - (self.burst - 1) * self._interval)
        delay = self._due - now
        self._due += self._interval
        if delay > 0:
            await self._sleep(delay)
