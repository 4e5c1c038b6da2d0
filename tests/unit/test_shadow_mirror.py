"""The shadow mirror's bounds and accounting: never waited for, bounded, every copy counted.

The backend here is a stand-in with the two methods the mirror calls (``check``, ``run``),
so the rules are tested without timing; the real model path is
tests/integration/test_traffic_split.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from pipeline.contract.request import decode_request, encode_request
from pipeline.kafka.outbox import OutRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.traffic_metrics import TrafficMetrics
from workers.stateless.backend import BatchOutput
from workers.stateless.shadow import ShadowCopy, ShadowMirror
from workers.stateless.tensor_map import TensorMap
from workers.stateless.triton_backend import TritonModelBackend


@dataclass
class _Record:
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    topic: str = "in"
    partition: int = 0
    offset: int = 0
    timestamp: int = 0


@dataclass
class _Backend:
    """What the mirror calls of a TritonModelBackend; ``gate`` holds every call until set."""

    model: str = "shadow_model"
    model_version: str = ""
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    fail_setup: bool = False

    async def setup(self) -> int:
        if self.fail_setup:
            raise RuntimeError("Triton has no model 'shadow_model'")
        return 64

    def check(self, request: Any) -> None:
        return None

    async def run(self, requests: Any, prepared: Any = ()) -> BatchOutput:
        await self.gate.wait()
        return BatchOutput([{"score": np.ones((1, 1), np.float32)} for _ in requests], self.model, "1")

    async def close(self) -> None:
        return None


def _copy(i: int) -> ShadowCopy:
    record = encode_request({"features": np.zeros((1, 16), np.float32)}, correlation_id=f"c{i}")
    request = decode_request(record.value, record.headers)
    return ShadowCopy(cast(Any, _Record(record.key, record.value, record.headers)), request, request)


def _mirror(backend: _Backend, max_inflight: int) -> tuple[ShadowMirror, PipelineMetrics, list[OutRecord]]:
    metrics = PipelineMetrics()
    sent: list[OutRecord] = []

    async def send(records: list[OutRecord]) -> None:
        sent.extend(records)

    mirror = ShadowMirror(
        cast(TritonModelBackend, backend), stage="s", topic="out.shadow", max_inflight=max_inflight,
        tensor_map=TensorMap(), counter=TrafficMetrics.of(metrics).shadow,
    )
    mirror.start(send)
    return mirror, metrics, sent


def _count(metrics: PipelineMetrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value("pipeline_shadow_total", {"stage": "s", "outcome": outcome})
    return value or 0.0


def test_busy_shadow_drops_instead_of_waiting_and_results_go_to_the_shadow_topic() -> None:
    async def scenario() -> tuple[PipelineMetrics, list[OutRecord]]:
        backend = _Backend()
        mirror, metrics, sent = _mirror(backend, max_inflight=2)
        await asyncio.sleep(0)  # setup done
        for i in range(3):  # the third finds both calls busy: dropped at once, not queued
            mirror.offer([_copy(2 * i), _copy(2 * i + 1)])
        assert _count(metrics, "dropped") == 2
        backend.gate.set()
        await asyncio.sleep(0.05)
        await mirror.close()
        return metrics, sent

    metrics, sent = asyncio.run(scenario())
    assert (_count(metrics, "sent"), _count(metrics, "failed"), _count(metrics, "dropped")) == (4, 0, 2)
    assert {r.topic for r in sent} == {"out.shadow"}
    assert all(not r.counts_as_result for r in sent)
    assert {dict(r.headers)["pipeline-route"] for r in sent} == {b"shadow"}


def test_unavailable_shadow_counts_failed_and_a_shutdown_counts_dropped() -> None:
    async def scenario() -> tuple[PipelineMetrics, PipelineMetrics]:
        missing, metrics_missing, _ = _mirror(_Backend(fail_setup=True), max_inflight=2)
        await asyncio.sleep(0)
        missing.offer([_copy(0), _copy(1), _copy(2)])
        await missing.close()
        stuck, metrics_stuck, _ = _mirror(_Backend(), max_inflight=2)
        await asyncio.sleep(0)
        stuck.offer([_copy(0)])
        await asyncio.sleep(0)
        await stuck.close()  # its call never returned: cancelled, counted dropped
        return metrics_missing, metrics_stuck

    missing, stuck = asyncio.run(scenario())
    assert (_count(missing, "failed"), _count(missing, "sent")) == (3, 0)
    assert (_count(stuck, "dropped"), _count(stuck, "sent")) == (1, 0)
