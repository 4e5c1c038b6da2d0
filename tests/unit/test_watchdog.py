"""Nothing wedges, the pure parts: record ages, stalls, health answers, call and run bounds."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, cast

import aiohttp
import numpy as np
import pytest
from aiokafka.structs import TopicPartition

from pipeline.audio import AudioInput
from pipeline.contract.request import InferenceRequest
from pipeline.failure_policy import FailureKind
from pipeline.kafka.ordering import OrderedOffsets
from pipeline.observability.metrics import PipelineMetrics
from pipeline.runtime.health import HealthServer
from pipeline.runtime.runner import _bounded_shutdown
from pipeline.runtime.stages import stall_after_s
from pipeline.runtime.watchdog import Liveness, Watchdog
from pipeline.topology.model import Topology
from workers.runtime.stage_io import StageIO
from workers.runtime.stream_stage import StreamStage
from workers.stateless.dali import DaliAudioBackend, DaliRunTimeout, DaliSettings
from workers.stateless.triton_backend import call_timeout

TP0, TP1 = TopicPartition("in", 0), TopicPartition("in", 1)


def test_the_oldest_unfinished_record_is_the_head_of_its_line() -> None:
    offsets: OrderedOffsets[str] = OrderedOffsets()
    first = offsets.add(TP0, 10)
    second = offsets.add(TP0, 11)
    assert offsets.oldest(TP0) is first and offsets.oldest(TP1) is None
    second.output = "done"
    offsets.acknowledge(second)  # finished out of order: the head is still waiting
    assert offsets.oldest(TP0) is first
    first.output = "done"
    offsets.acknowledge(first)
    assert offsets.oldest(TP0) is None


class _Stage:
    """What the watchdog reads of a stage."""

    def __init__(self, name: str, limit: float, ages: dict[TopicPartition, float]) -> None:
        self.io = StageIO(name, "g", "in", "out", "dl", stall_after_s=limit)
        self.ages = ages
        self.ready = True  # consuming

    def oldest_unfinished(self) -> dict[TopicPartition, float]:
        return self.ages


def _gauge(
    metrics: PipelineMetrics, name: str = "pipeline_oldest_unfinished_record_age_seconds"
) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels.values()): s.value
        for family in metrics.registry.collect()
        if family.name == name
        for s in family.samples
    }


def test_watchdog_names_stalled_partitions_and_exports_every_age() -> None:
    metrics = PipelineMetrics()
    stage = _Stage("classify", 2.0, {TP0: 5.0, TP1: 0.5})
    watchdog = Watchdog([cast(StreamStage, stage)], metrics)
    stalls = watchdog.check()
    assert [(s.stage, s.topic, s.partition) for s in stalls] == [("classify", "in", 0)]
    assert "stage classify: partition in-0" in stalls[0].describe()
    assert _gauge(metrics) == {("classify", "in", "0"): 5.0, ("classify", "in", "1"): 0.5}
    assert _gauge(metrics, "pipeline_stage_ready") == {("classify",): 0.0}
    stage.ages = {TP1: 0.1}  # partition 0 moved (or was handed back)
    assert watchdog.check() == []
    assert _gauge(metrics) == {("classify", "in", "1"): 0.1}
    assert _gauge(metrics, "pipeline_stage_ready") == {("classify",): 1.0}
    stage.ready = False  # not consuming (starting, or its consumer failed)
    watchdog.check()
    assert _gauge(metrics, "pipeline_stage_ready") == {("classify",): 0.0}


def test_default_stall_threshold_follows_the_call_bound() -> None:
    topology = Topology.model_validate(
        {
            "name": "t",
            "input_topic": "a",
            "result_topic": "b",
            "stages": [
                {"name": "x", "kind": "stateless", "model": "m", "call_timeout_s": 4.0},
                {"name": "y", "kind": "stateless", "model": "m", "stall_after_s": 7.0},
            ],
        }
    )
    assert [stall_after_s(s) for s in topology.stages] == [8.0, 7.0]
    assert topology.drain_timeout_s == 30.0


def _request(deadline_ms: int | None) -> InferenceRequest:
    return InferenceRequest(
        correlation_id="c",
        model_name="",
        model_version="",
        inputs={"x": np.zeros((1, 1), np.float32)},
        datatypes={"x": "FP32"},
        deadline_ms=deadline_ms,
    )


def test_a_triton_call_is_never_unbounded() -> None:
    assert call_timeout([_request(None)], 30.0) == 30.0
    soon = int(time.time() * 1000) + 2_000
    assert 1.0 < call_timeout([_request(None), _request(soon)], 30.0) <= 2.0
    assert call_timeout([_request(int(time.time() * 1000) + 60_000)], 30.0) == 30.0
    assert call_timeout([_request(1)], 30.0) == pytest.approx(0.001)


async def test_health_endpoints_answer_with_the_reasons() -> None:
    problems: list[str] = ["stage classify: partition in-0 has a record unfinished for 5.0s (limit 2s)"]
    dead: list[str] = []
    server = HealthServer(PipelineMetrics(), lambda: problems, host="127.0.0.1", not_live=lambda: dead)
    port = await server.start()
    try:
        async with aiohttp.ClientSession() as http:

            async def get(path: str) -> tuple[int, str]:
                async with http.get(f"http://127.0.0.1:{port}{path}") as response:
                    return response.status, await response.text()

            status, body = await get("/readyz")
            assert status == 503 and "partition in-0" in body
            assert await get("/livez") == (200, "ok\n")
            assert await get("/healthz") == (200, "ok\n")
            problems.clear()
            assert await get("/readyz") == (200, "ready\n")
            dead.append("task classify ended: RuntimeError()")
            assert (await get("/livez"))[0] == 503
    finally:
        await server.stop()


async def test_liveness_fails_on_a_dead_task_but_not_while_stopping() -> None:
    stop = asyncio.Event()
    liveness = Liveness(stop)

    async def crash() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(crash(), name="classify")
    liveness.watch([task])
    await asyncio.gather(task, return_exceptions=True)
    assert liveness.problems() == ["task classify ended: RuntimeError('boom')"]
    stop.set()
    assert liveness.problems() == []


async def test_shutdown_cancels_what_outlives_its_bound() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(forever(), name="stuck")
    started = time.monotonic()
    await _bounded_shutdown([task], 0.2, started)
    assert task.cancelled()
    assert time.monotonic() - started < 2.0


class _Preprocessor:
    device = "cpu"

    def __init__(self, release: threading.Event | None = None) -> None:
        self.release = release

    def process(self, inputs: list[AudioInput]) -> list[np.ndarray]:
        if self.release is not None:
            self.release.wait()  # stuck until the test ends
        return [np.zeros(4, np.float32) for _ in inputs]


async def test_a_stuck_dali_run_times_out_and_later_runs_use_a_fresh_thread() -> None:
    backend = DaliAudioBackend(DaliSettings(run_timeout_s=0.3))
    stuck = threading.Event()
    cast(Any, backend)._preprocessor = _Preprocessor(stuck)
    cast(Any, backend)._build = _Preprocessor
    chunk = AudioInput(pcm=np.zeros(160, np.float32), sample_rate=16_000)
    try:
        with pytest.raises(DaliRunTimeout) as timed_out:
            await backend.run([], [chunk])
        failure = await backend.classify(timed_out.value)
        assert failure.kind is FailureKind.PERMANENT
        output = await asyncio.wait_for(backend.run([], [chunk, chunk]), timeout=5)
        assert len(output.outputs) == 2 and backend.abandoned_runs == 1
    finally:
        stuck.set()
        await backend.close()
