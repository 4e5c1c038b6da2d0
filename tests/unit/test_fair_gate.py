"""The fair gate of batch calls: round-robin across lanes, FIFO within one, cancellation-safe."""

from __future__ import annotations

import asyncio

import pytest

from workers.fair_gate import FairGate


async def _order_served(gate: FairGate, lanes: list[str], hold_s: float = 0.001) -> list[str]:
    """Start one waiter per entry of ``lanes`` (in that order) and record the order they get a slot."""
    served: list[str] = []

    async def one(lane: str) -> None:
        async with gate.slot(lane):
            served.append(lane)
            await asyncio.sleep(hold_s)

    tasks = [asyncio.create_task(one(lane)) for lane in lanes]
    await asyncio.gather(*tasks)
    return served


def test_a_flooding_lane_cannot_starve_another() -> None:
    async def scenario() -> list[str]:
        gate = FairGate(2)
        return await _order_served(gate, ["flood"] * 100 + ["quiet"] * 3)

    served = asyncio.run(scenario())
    # First-come would serve "quiet" only after all 100 "flood" batches; round-robin serves
    # each quiet batch after at most one more flood batch.
    positions = [i for i, lane in enumerate(served) if lane == "quiet"]
    assert positions == [3, 5, 7], served[:10]
    assert served.count("flood") == 100


def test_one_lane_is_a_fifo_semaphore() -> None:
    async def scenario() -> tuple[list[int], int]:
        gate = FairGate(3)
        served: list[int] = []
        peak = 0
        running = 0

        async def one(i: int) -> None:
            nonlocal peak, running
            async with gate.slot():
                running += 1
                peak = max(peak, running)
                served.append(i)
                await asyncio.sleep(0.001)
                running -= 1

        await asyncio.gather(*(one(i) for i in range(20)))
        return served, peak

    served, peak = asyncio.run(scenario())
    assert served == list(range(20))
    assert peak == 3


def test_a_cancelled_waiter_gives_its_turn_away() -> None:
    async def scenario() -> list[str]:
        gate = FairGate(1)
        served: list[str] = []
        await gate.acquire("a")  # the only slot is taken

        async def one(lane: str) -> None:
            async with gate.slot(lane):
                served.append(lane)

        gone = asyncio.create_task(one("b"))
        stays = asyncio.create_task(one("c"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        gate.release()
        await asyncio.wait_for(stays, 1)
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert gate.waiting == 0
        return served

    assert asyncio.run(scenario()) == ["c"]


def test_at_least_one_slot() -> None:
    with pytest.raises(ValueError):
        FairGate(0)
