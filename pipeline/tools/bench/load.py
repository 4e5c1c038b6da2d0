"""The load generator: one step's requests, as a closed loop or an open one.

It knows nothing of Kafka or Triton: a *caller* makes one request and records
its outcome in the step's :class:`~.stats.StepStats` (bounded by its own
timeout), so the pipeline and the direct Triton path are loaded by exactly the
same code and their numbers compare.

* concurrency N: N loops, each sending its next request when the previous one
  ended (perf_analyzer's closed loop);
* rate R: requests sent on R's schedule by :class:`~pipeline.tools.pacing.Pacer`
  (exact on average at thousands per second), each awaited on its own; at most
  ``max_outstanding`` wait at once, beyond which sending waits and the table's
  "sent/s" shows the rate fell short.

A stop (Ctrl-C) ends sending and cancels the requests still waiting: the step
is then incomplete, and the sweep drops it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from pipeline.tools.bench.plan import Mode, Step
from pipeline.tools.bench.stats import StepStats
from pipeline.tools.pacing import Pacer

Caller = Callable[[StepStats], Awaitable[None]]
"""Makes one request; records ``stats.sent`` and ``stats.ended``; returns when it ended."""

#: Open loop: requests awaiting their outcome at once, at most (bounds memory when the target stalls).
MAX_OUTSTANDING = 10_000


async def run_step(
    call: Caller,
    step: Step,
    duration_s: float,
    stop: asyncio.Event,
    *,
    max_outstanding: int = MAX_OUTSTANDING,
) -> StepStats | None:
    """Load ``call`` at ``step`` for ``duration_s``; the step's stats, or None when stopped."""
    stats = StepStats()
    if step.mode is Mode.CONCURRENCY:
        work = _closed_loop(call, int(step.level), duration_s, stats, stop)
    else:
        work = _open_loop(call, step.level, duration_s, stats, stop, max_outstanding)
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not task.done():  # stopped: what is still waiting will not be waited for
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    task.result()  # a caller's bug surfaces here, not as a silently short step
    return None if stop.is_set() else stats


async def _closed_loop(call: Caller, concurrency: int, duration_s: float, stats: StepStats, stop: asyncio.Event) -> None:
    started = time.monotonic()
    deadline = started + duration_s

    async def loop() -> None:
        while time.monotonic() < deadline and not stop.is_set():
            await call(stats)

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    stats.sending_s = min(time.monotonic() - started, duration_s)


async def _open_loop(
    call: Caller,
    rate: float,
    duration_s: float,
    stats: StepStats,
    stop: asyncio.Event,
    max_outstanding: int,
) -> None:
    pacer = Pacer(rate)
    slots = asyncio.Semaphore(max_outstanding)
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        try:
            await call(stats)
        finally:
            slots.release()

    started = time.monotonic()
    deadline = started + duration_s
    try:
        while not stop.is_set():
            await pacer.wait()
            if time.monotonic() >= deadline:
                break
            await slots.acquire()
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        stats.sending_s = min(time.monotonic() - started, duration_s)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
