"""Refresh every stage's consumer lag from the brokers' end offsets, every few seconds.

Fetches update the lag as records arrive (:mod:`workers.runtime.lag`); this loop covers
the consumers that fetch nothing (paused by backpressure, or waiting out a
Triton outage), whose lag is the one an operator is looking for.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from workers.runtime.stream_stage import StreamStage

LAG_INTERVAL_S = 2.0


async def refresh_lag(stages: Sequence[StreamStage], stop: asyncio.Event, interval_s: float = LAG_INTERVAL_S) -> None:
    while not stop.is_set():
        for stage in stages:
            await stage.refresh_lag()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
