"""UpstreamWatch polls the upstream groups in the background: a stage's sweep never waits
on the broker's round trips, one poll is in flight at a time, and a failing poll is logged
with the states before it left standing."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from pipeline.kafka.progress import BranchState, Upstream, UpstreamProgress
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings
from workers.runtime.upstream import UpstreamWatch, highwater_or_end


class SlowProgress(UpstreamProgress):
    """The real progress object, its broker round trips replaced by a gate the test opens."""

    def __init__(self) -> None:
        super().__init__(KafkaSettings(), [Upstream("g", "t")], ["own"])
        self.gate = asyncio.Event()
        self.polls: list[set[int]] = []
        self.fail = False

    async def poll(self, consumer: AIOKafkaConsumer, partitions: Any) -> None:
        self.polls.append(set(partitions))
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("boom")
        self._states = {("", p): BranchState.CAUGHT_UP for p in partitions}


CONSUMER = cast(AIOKafkaConsumer, object())
TP = [TopicPartition("own", 0), TopicPartition("own", 1)]


def test_a_poll_runs_in_the_background_one_at_a_time() -> None:
    async def scenario() -> None:
        now = [0.0]
        progress = SlowProgress()
        watch = UpstreamWatch(progress, stage="vad", metrics=PipelineMetrics(), every_s=0.5, clock=lambda: now[0])
        watch.poll(CONSUMER, TP)  # returns at once although the broker has not answered
        await asyncio.sleep(0)
        assert progress.polls == [{0, 1}]
        assert watch.state("", TP[0]) is BranchState.BEHIND, "no answer yet: behind"
        now[0] = 1.0
        watch.poll(CONSUMER, TP)
        assert len(progress.polls) == 1, "a poll in flight is not doubled"
        progress.gate.set()
        await watch.settled()
        assert watch.state("", TP[0]) is BranchState.CAUGHT_UP
        now[0] = 1.2
        watch.poll(CONSUMER, TP)
        await watch.settled()
        assert len(progress.polls) == 2, "every_s after the last poll began"
        now[0] = 1.4
        watch.poll(CONSUMER, TP)
        await watch.settled()
        assert len(progress.polls) == 2, "not again within every_s"
        await watch.stop()

    asyncio.run(scenario())


def test_a_failing_poll_is_logged_and_the_states_before_it_stand(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        now = [0.0]
        progress = SlowProgress()
        watch = UpstreamWatch(progress, stage="vad", metrics=PipelineMetrics(), every_s=0.5, clock=lambda: now[0])
        progress.gate.set()
        watch.poll(CONSUMER, TP)
        await watch.settled()
        progress.fail = True
        now[0] = 1.0
        watch.poll(CONSUMER, TP)
        await watch.settled()
        assert watch.state("", TP[1]) is BranchState.CAUGHT_UP
        await watch.stop()

    asyncio.run(scenario())
    assert "polling the upstream groups failed" in caplog.text


def test_stop_cancels_a_poll_in_flight() -> None:
    async def scenario() -> None:
        progress = SlowProgress()
        watch = UpstreamWatch(progress, stage="vad", metrics=PipelineMetrics())
        watch.poll(CONSUMER, TP)
        await asyncio.sleep(0)
        await asyncio.wait_for(watch.stop(), 1.0)  # the gate never opens: stop must not wait on it
        assert watch.state("", TP[0]) is BranchState.BEHIND

    asyncio.run(scenario())


def test_a_partition_reaches_as_far_as_the_fetcher_or_the_poll_saw() -> None:
    """Tansu lists ends (and reports fetch high watermarks) short of its log: the poll's end,
    read past the listed one, counts when it is further, so a join or a sequence stage that
    read to a short end does not take its input as read to the end."""
    progress = SlowProgress()
    tp = TopicPartition("own", 0)
    fetched: dict[TopicPartition, int | None] = {tp: 40}
    end = highwater_or_end(lambda t: fetched.get(t), progress)
    assert end(tp) == 40, "no poll yet: the fetcher's"
    progress._ends = {tp: 46}
    assert end(tp) == 46
    fetched[tp] = 50
    assert end(tp) == 50
    assert end(TopicPartition("own", 1)) is None
