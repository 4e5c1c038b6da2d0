"""Ensemble topologies across Kafka: fan-out, joins (inner, outer, any), join state after kill -9."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from pipeline.contract.records import Record, read_dead_letter
from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from tests.helpers.dense_reference import (
    mlp_reference,
    norm_reference,
    random_features,
    score_reference,
)
from tests.helpers.kafka_io import collect, header, produce
from tests.helpers.topology_process import (
    PipelineProcess,
    TopologyFiles,
    collect_outputs,
    distinct_keys,
    pipeline_process,
    write_ensemble_topology,
)

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

def _ensemble(tmp_path: Path, *, mode: str = "inner", window_ms: float = 5000, **join: Any) -> TopologyFiles:
    return write_ensemble_topology(tmp_path, mode=mode, window_ms=window_ms, **join)


def _requests(n: int, seed: int, prefix: str) -> tuple[list[Record], np.ndarray]:
    raw = random_features(n, seed)
    return [encode_request({"raw": raw[i : i + 1]}, correlation_id=f"{prefix}-{i}") for i in range(n)], raw


def _index(cid: str) -> int:
    return int(cid.rsplit("-", 1)[1])


def _check_full(results: list[Any], raw: np.ndarray) -> dict[str, int]:
    seen: dict[str, int] = {}
    for record in results:
        response = decode_response(record.value, record.headers)
        i = _index(response.correlation_id)
        features = norm_reference(raw[i : i + 1])
        np.testing.assert_allclose(response.outputs["logits"], mlp_reference(features), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(response.outputs["score"], score_reference(features), rtol=1e-4, atol=1e-5)
        assert set(response.outputs) == {"logits", "score"}
        assert header(record, "pipeline-stage") == "join-result"
        assert header(record, "join-status") is None
        seen[response.correlation_id] = seen.get(response.correlation_id, 0) + 1
    return seen


def test_fan_out_and_inner_join_end_to_end(kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path) -> None:
    topo = _ensemble(tmp_path)
    records, raw = _requests(1000, seed=11, prefix="ens")
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        out = collect_outputs(kafka_bootstrap, topo, lambda rs: len(rs) >= 1000, timeout=120)
        assert worker.terminate() == 0
    assert out.on(topo.dead_letter_topic) == []
    seen = _check_full(out.on(topo.result_topic), raw)
    assert len(seen) == 1000 and set(seen.values()) == {1}


STEPS_BUT_SCORE = ["normalise", "classify", "join-result"]


def test_outer_join_marks_a_partial_result_when_a_branch_is_slower_than_the_window(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # score never runs here: its group has no live member, so it is gone after branch_gone_after
    # (issue 28: a branch is behind until proven gone, never judged by time since a commit).
    topo = _ensemble(tmp_path, mode="outer", window_ms=1500, branch_gone_after="5s")
    records, raw = _requests(40, seed=12, prefix="outer")
    with pipeline_process(topo, cli_env, tmp_path, stage=STEPS_BUT_SCORE) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        out = asyncio.run(collect(kafka_bootstrap, [topo.result_topic], done=lambda rs: len(rs) >= 40, timeout=60))
        # The slow branch catches up now: its late outputs must not add results.
        with pipeline_process(topo, cli_env, tmp_path, stage="score") as late:
            deadline = time.monotonic() + 60
            while late.metric("pipeline_results_total") < 40 and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(2)
            assert late.terminate() == 0
        after = asyncio.run(collect(kafka_bootstrap, [topo.result_topic], done=lambda rs: False, timeout=3))
        assert worker.terminate() == 0
    assert len(after.records) == 40, "late branch outputs after an expired outer join must be dropped"
    for record in out.records:
        response = decode_response(record.value, record.headers)
        assert header(record, "join-status") == "partial"
        assert response.parameters["join_status"] == "partial"
        assert response.parameters["join_missing"] == "score"
        assert set(response.outputs) == {"logits"}
        i = _index(response.correlation_id)
        np.testing.assert_allclose(
            response.outputs["logits"], mlp_reference(norm_reference(raw[i : i + 1])), rtol=1e-4, atol=1e-5
        )


def test_any_join_the_first_branch_wins(kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path) -> None:
    topo = _ensemble(tmp_path, mode="any", window_ms=2000)
    records, _raw = _requests(30, seed=13, prefix="any")
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        out = asyncio.run(collect(kafka_bootstrap, [topo.result_topic], done=lambda rs: len(rs) >= 30, timeout=60))
        time.sleep(2)  # the other branch arrives too: it must not add a second result
        again = asyncio.run(collect(kafka_bootstrap, [topo.result_topic], done=lambda rs: False, timeout=2))
        assert worker.terminate() == 0
    assert len(again.records) == 30
    for record in out.records:
        response = decode_response(record.value, record.headers)
        assert response.parameters["join_status"] == "first"
        winner = set(response.outputs)
        assert winner in ({"logits"}, {"score"})
        assert response.parameters["join_missing"] == ("score" if winner == {"logits"} else "classify")


def test_join_state_survives_kill_9_of_the_joining_worker(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    n = 200
    topo = _ensemble(tmp_path, mode="inner", window_ms=120_000)
    records, raw = _requests(n, seed=14, prefix="kill")
    with pipeline_process(topo, cli_env, tmp_path, stage=["normalise", "classify"]):
        joiner = PipelineProcess(topo, cli_env, tmp_path / "join-1.log", stage="join-result").start()
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        deadline = time.monotonic() + 60
        while joiner.metric("pipeline_requests_total") < n and time.monotonic() < deadline:
            time.sleep(0.1)
        assert joiner.metric("pipeline_requests_total") >= n, "the join should hold every classify output"
        time.sleep(0.5)  # let the checkpoints of the last arrivals be acknowledged
        joiner.kill()  # half-joined state for every request, only in Kafka now
        restarted = PipelineProcess(topo, cli_env, tmp_path / "join-2.log", stage="join-result").start()
        with pipeline_process(topo, cli_env, tmp_path, stage="score"):
            out = collect_outputs(kafka_bootstrap, topo, distinct_keys(n), timeout=120)
        assert restarted.terminate() == 0, restarted.log()
    dead = out.on(topo.dead_letter_topic)
    assert dead == [], [read_dead_letter(d.headers).reason for d in dead[:3]]
    seen = _check_full(out.on(topo.result_topic), raw)
    assert set(seen) == {f"kill-{i}" for i in range(n)}


async def _send_to(bootstrap: str, sends: list[tuple[str, int, bytes | None, bytes]]) -> None:
    """(topic, partition, key, value) in this order, each acknowledged before the next."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for topic, partition, key, value in sends:
            await producer.send_and_wait(topic, value, key=key, partition=partition)
    finally:
        await producer.stop()


def test_windows_close_when_the_last_record_of_a_branch_partition_is_dead_lettered_unhandled(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """A keyless branch record is dead-lettered before the join handles it. When it is the last
    record of its partition, the partition must still count as read to its end, or no window
    on that partition number ever closes (the hostile campaign's lone future-dated branch
    record waited forever whenever a keyless record landed last on its partition)."""
    topo = _ensemble(tmp_path, window_ms=2000)
    classify, score = f"{topo.name}.classify.out", f"{topo.name}.score.out"
    value = encode_request({"raw": random_features(1, 15)}, correlation_id="x").value
    sends: list[tuple[str, int, bytes | None, bytes]] = []
    for p in range(2):  # per partition: a lone score record, then a keyless one; a lone classify record
        sends += [(score, p, f"lone-score-{p}".encode(), value), (score, p, None, value)]
        sends += [(classify, p, f"lone-classify-{p}".encode(), value)]
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(_send_to(kafka_bootstrap, sends))
        out = asyncio.run(collect(kafka_bootstrap, [topo.dead_letter_topic], done=lambda rs: len(rs) >= 6, timeout=90))
        assert worker.terminate() == 0
    reasons = sorted((r.key or b"", read_dead_letter(r.headers).error_class) for r in out.records)
    assert reasons == sorted(
        [(b"", "missing-correlation-id")] * 2
        + [(f"lone-{b}-{p}".encode(), "deadline-exceeded") for b in ("score", "classify") for p in range(2)]
    ), reasons
