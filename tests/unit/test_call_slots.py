"""The call slots of a stateless stage: round-robin across models, FIFO within one, cancellation-safe."""

from __future__ import annotations

import asyncio

import pytest

from workers.stateless.call_slots import CallSlots


async def _order_served(gate: CallSlots, models: list[str], hold_s: float = 0.001) -> list[str]:
    """Start one waiter per entry of ``models`` (in that order) and record the order they get a slot."""
    served: list[str] = []

    async def one(model: str) -> None:
        async with gate.slot(model):
            served.append(model)
            await asyncio.sleep(hold_s)

    tasks = [asyncio.create_task(one(model)) for model in models]
    await asyncio.gather(*tasks)
    return served


def test_a_flooding_lane_cannot_starve_another() -> None:
    async def scenario() -> list[str]:
        gate = CallSlots(2)
        return await _order_served(gate, ["flood"] * 100 + ["quiet"] * 3)

    served = asyncio.run(scenario())
    # First-come would serve "quiet" only after all 100 "flood" batches; round-robin serves
    # each quiet batch after at most one more flood batch.
    positions = [i for i, model in enumerate(served) if model == "quiet"]
    assert positions == [3, 5, 7], served[:10]
    assert served.count("flood") == 100


def test_one_lane_is_a_fifo_semaphore() -> None:
    async def scenario() -> tuple[list[int], int]:
        gate = CallSlots(3)
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
        gate = CallSlots(1)
        served: list[str] = []
        await gate.acquire("a")  # the only slot is taken

        async def one(model: str) -> None:
            async with gate.slot(model):
                served.append(model)

        gone = asyncio.create_task(one("b"))
        stays = asyncio.create_task(one("c"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        gate.free()
        await asyncio.wait_for(stays, 1)
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert gate.waiting == 0
        return served

    assert asyncio.run(scenario()) == ["c"]


def test_at_least_one_slot() -> None:
    with pytest.raises(ValueError):
        CallSlots(0)
