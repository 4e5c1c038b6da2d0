"""The stateless stage end to end: `pipeline run` against the real broker and Triton.

Every test runs the real CLI in a subprocess on a private topology (unique
topics and consumer group), produces with a plain Kafka client and checks the
result and dead-letter topics.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord
from tritonclient.grpc import service_pb2

from pipeline.contract.records import Record, read_dead_letter
from pipeline.contract.request import decode_request, encode_request
from pipeline.contract.response import decode_response
from tests.helpers.cli import run_cli
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.kafka_io import collect, header, produce
from tests.helpers.own_triton import OwnTriton
from tests.helpers.topology_process import (
    PipelineProcess,
    collect_outputs,
    distinct_keys,
    pipeline_process,
    write_topology,
)

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

Rec = ConsumerRecord[bytes, bytes]


def _requests(n: int, seed: int, prefix: str) -> tuple[list[Record], np.ndarray]:
    features = random_features(n, seed)
    records = [
        encode_request({"features": features[i : i + 1]}, correlation_id=f"{prefix}-{i}") for i in range(n)
    ]
    return records, features


def _check_results(results: list[Rec], features: np.ndarray, prefix: str) -> dict[str, int]:
    """Every result has the right logits for its correlation ID; returns counts per ID."""
    counts: Counter[str] = Counter()
    for record in results:
        response = decode_response(record.value, record.headers)
        cid = response.correlation_id
        assert header(record, "correlation-id") == cid
        assert record.key == cid.encode()
        index = int(cid.removeprefix(f"{prefix}-"))
        np.testing.assert_allclose(
            response.outputs["logits"], mlp_reference(features[index : index + 1]), rtol=1e-4, atol=1e-5
        )
        assert header(record, "pipeline-stage") == "classify"
        assert header(record, "model-name") == "dense_classifier"
        assert header(record, "model-version") == "1"
        counts[cid] += 1
    return dict(counts)


def _ids_by_partition(records: list[Rec]) -> dict[int, list[str]]:
    by_partition: dict[int, list[str]] = defaultdict(list)
    for record in records:
        by_partition[record.partition].append(record.key.decode())
    return by_partition


def test_ten_thousand_requests_all_answered_correctly_and_in_partition_order(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """As the acceptance says: `pipeline run`, 10,000 requests from `pipeline produce`."""
    n = 10_000
    topo = write_topology(tmp_path, partitions=4)
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        sent = run_cli(
            cli_env, "produce", "--topology", str(topo.path), "--random",
            "--count", str(n), "--seed", "7", "--id-prefix", "bulk-", timeout=180,
        )
        assert sent.returncode == 0, sent.stderr
        out = collect_outputs(kafka_bootstrap, topo, lambda rs: len(rs) >= n, timeout=180)
        # The endpoints answer while the stage works.
        assert worker.get("/healthz")[0] == 200
        assert worker.get("/readyz")[0] == 200
        assert worker.metric_reaching("pipeline_results_total", n) == n
        batches = worker.metric("pipeline_batch_size_count")
        assert 0 < batches < n / 4, f"{batches} Triton calls for {n} requests: not batching"
        assert worker.terminate(timeout=60) == 0, worker.log()

    assert out.on(topo.dead_letter_topic) == []
    results = out.on(topo.result_topic)
    # The right numbers: each result against the features its request carried.
    requests = asyncio.run(
        collect(kafka_bootstrap, [topo.input_topic], done=lambda rs: len(rs) >= n, timeout=60)
    ).records
    features = {}
    for record in requests:
        request = decode_request(record.value, record.headers)
        features[request.correlation_id] = request.inputs["features"]
    assert len(features) == n
    counts: Counter[str] = Counter()
    for record in results:
        response = decode_response(record.value, record.headers)
        cid = response.correlation_id
        assert record.key == cid.encode() and header(record, "correlation-id") == cid
        np.testing.assert_allclose(response.outputs["logits"], mlp_reference(features[cid]), rtol=1e-4, atol=1e-5)
        counts[cid] += 1
    assert set(counts) == set(features) and set(counts.values()) == {1}

    # Per-partition order: results of input partition p leave in p's arrival order.
    assert _ids_by_partition(results) == _ids_by_partition(requests)

    # The metrics topic got periodic snapshots.
    snapshots = asyncio.run(
        collect(kafka_bootstrap, [topo.metrics_topic], done=lambda rs: len(rs) >= 1, timeout=20)
    ).records
    assert snapshots, "no metrics snapshot"
    last = json.loads(snapshots[-1].value)
    assert last["topology"] == topo.name
    assert "pipeline_requests" in last["metrics"]


# ------------------------------------------------------------------ bad input


def _pb(request: service_pb2.ModelInferRequest) -> bytes:
    return request.SerializeToString()


def _pb_request(shape: list[int], datatype: str = "FP32", name: str = "features", raw: bytes | None = None) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(id="")
    tensor = request.inputs.add()
    tensor.name = name
    tensor.datatype = datatype
    tensor.shape.extend(shape)
    count = int(np.prod(shape))
    itemsize = {"FP32": 4, "INT32": 4, "FP64": 8}.get(datatype, 4)
    request.raw_input_contents.append(raw if raw is not None else b"\0" * count * itemsize)
    return request


PB = [("content-type", b"application/vnd.oip.v2.infer-request+protobuf")]
JS = [("content-type", b"application/json")]


def _cid(cid: str) -> list[tuple[str, bytes]]:
    return [("correlation-id", cid.encode())]


def _json(body: object) -> bytes:
    return json.dumps(body).encode()


def _good_json(cid: str, **extra: object) -> dict[str, object]:
    body: dict[str, object] = {
        "id": cid,
        "inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}],
    }
    body.update(extra)
    return body


def _bad_inputs() -> list[tuple[str, bytes | None, list[tuple[str, bytes]], str]]:
    """(correlation id, value, headers, expected error class): one per kind of bad input."""
    past = str(int(time.time() * 1000) - 60_000).encode()
    with_id = _pb_request([1, 16])
    return [
        ("b-empty", b"", PB + _cid("b-empty"), "empty-value"),
        ("b-tombstone", None, PB + _cid("b-tombstone"), "empty-value"),
        ("b-garbage-pb", b"\xff\xfe\x00garbage", PB + _cid("b-garbage-pb"), "malformed-request"),
        ("b-bad-json", b"{not json", JS + _cid("b-bad-json"), "malformed-request"),
        ("b-json-array", b"[1, 2, 3]", JS + _cid("b-json-array"), "malformed-request"),
        ("b-content-type", b"hello", [("content-type", b"text/plain")] + _cid("b-content-type"), "unsupported-content-type"),
        ("b-no-content-type", _json(_good_json("b-no-content-type")), _cid("b-no-content-type"), "missing-content-type"),
        ("b-no-id", _pb(_pb_request([1, 16])), PB, "missing-correlation-id"),
        ("b-conflict", _json(_good_json("other-id")), JS + _cid("b-conflict"), "conflicting-correlation-id"),
        ("b-oversized", b"{" + b" " * 70_000 + b"}", JS + _cid("b-oversized"), "oversized-value"),
        ("b-model", _json(_good_json("b-model", model_name="no_such_model")), JS + _cid("b-model"), "unknown-model"),
        ("b-input-name", _pb(_pb_request([1, 16], name="nope")), PB + _cid("b-input-name"), "unknown-input"),
        ("b-dtype", _pb(_pb_request([1, 16], datatype="INT32")), PB + _cid("b-dtype"), "datatype-mismatch"),
        ("b-shape", _pb(_pb_request([1, 8])), PB + _cid("b-shape"), "shape-mismatch"),
        ("b-short-raw", _pb(_pb_request([1, 16], raw=b"\0" * 10)), PB + _cid("b-short-raw"), "data-size-mismatch"),
        ("b-batch", _pb(_pb_request([65, 16])), PB + _cid("b-batch"), "batch-too-large"),
        (
            "b-output",
            _json(_good_json("b-output", outputs=[{"name": "no_such_output"}])),
            JS + _cid("b-output"),
            "unknown-output",
        ),
        ("b-deadline-text", _json(_good_json("b-deadline-text")), JS + _cid("b-deadline-text") + [("deadline", b"soon")], "bad-header"),
        ("b-deadline-past", _json(_good_json("b-deadline-past")), JS + _cid("b-deadline-past") + [("deadline", past)], "deadline-exceeded"),
        (
            "b-dup-input",
            _json({"id": "b-dup-input", "inputs": [_good_json("x")["inputs"][0], _good_json("x")["inputs"][0]]}),  # type: ignore[index]
            JS + _cid("b-dup-input"),
            "duplicate-input",
        ),
        ("b-negative-dim", _json({"id": "b-negative-dim", "inputs": [{"name": "features", "shape": [-1, 16], "datatype": "FP32", "data": []}]}), JS + _cid("b-negative-dim"), "shape-mismatch"),
        ("b-pb-with-id", _pb(with_id), PB + _cid("b-pb-with-id") + [("priority", b"-3")], "bad-header"),
    ]


def test_bad_input_goes_to_dead_letters_with_reason_and_the_worker_goes_on(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    bad = _bad_inputs()
    assert len({expected for *_, expected in bad}) >= 15
    topo = write_topology(tmp_path, partitions=1, stage={"max_request_bytes": 65_536})
    good_before = encode_request({"features": random_features(1, 5)}, correlation_id="good-before")
    good_after = encode_request({"features": random_features(1, 6)}, correlation_id="good-after")
    records = [good_before] + [Record(key=cid.encode(), value=value, headers=headers) for cid, value, headers, _ in bad] + [good_after]  # type: ignore[arg-type]
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        out = collect_outputs(kafka_bootstrap, topo, lambda rs: len(rs) >= len(records), timeout=60)
        dead_metric = worker.metric_reaching("pipeline_dead_letters_total", len(bad))
        assert worker.terminate() == 0

    results = out.on(topo.result_topic)
    assert [r.key for r in results] == [b"good-before", b"good-after"]
    dead = {r.key.decode(): r for r in out.on(topo.dead_letter_topic)}
    assert dead_metric == len(bad)
    sent = {cid: (value, headers) for cid, value, headers, _ in bad}
    for cid, _value, _headers, expected in bad:
        assert cid in dead, f"{cid} was not dead-lettered"
        record = dead[cid]
        letter = read_dead_letter(record.headers)
        assert letter.error_class == expected, f"{cid}: {letter.error_class} ({letter.reason})"
        assert letter.stage == "classify"
        assert letter.reason and "\n" not in letter.reason
        # Original key, value and headers kept byte for byte.
        value, headers = sent[cid]
        assert record.key == cid.encode()
        assert (record.value or b"") == (value or b"")
        assert list(record.headers)[: len(headers)] == headers


# ------------------------------------------------------------------ crash


def test_kill_9_mid_stream_replays_without_loss(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    n = 10_000
    topo = write_topology(tmp_path, partitions=4, stage={"batching": {"max_pending_requests": 2000}})
    records, features = _requests(n, seed=2, prefix="crash")
    asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))

    worker = PipelineProcess(topo, cli_env, tmp_path / "first.log").start()
    deadline = time.monotonic() + 120
    while worker.metric("pipeline_results_total") < 2_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    done_before = worker.metric("pipeline_results_total")
    worker.kill()  # SIGKILL: no drain, no commit
    assert 0 < done_before < n, f"crash must happen mid-stream (had {done_before})"

    with pipeline_process(topo, cli_env, tmp_path):
        out = collect_outputs(kafka_bootstrap, topo, distinct_keys(n), timeout=180)
    assert out.on(topo.dead_letter_topic) == []
    counts = _check_results(out.on(topo.result_topic), features, "crash")
    assert set(counts) == {f"crash-{i}" for i in range(n)}, "lost requests"
    duplicates = sum(c - 1 for c in counts.values())
    record_property("duplicates_after_kill_9", duplicates)
    print(f"\nkill -9 after {done_before:.0f} results: {duplicates} duplicate results of {n}")

    # Duplicates only inside the in-flight window: per input partition, the replayed
    # offsets form one contiguous run (from the last commit to the crash point).
    requests = asyncio.run(
        collect(kafka_bootstrap, [topo.input_topic], done=lambda rs: len(rs) >= n, timeout=60)
    ).records
    for partition in {r.partition for r in requests}:
        offsets = sorted(r.offset for r in requests if r.partition == partition and counts[r.key.decode()] > 1)
        if offsets:
            assert offsets[-1] - offsets[0] + 1 == len(offsets), f"partition {partition}: scattered duplicates"
            assert len(offsets) <= 2_000 + 1_000, "more duplicates than the in-flight window allows"


# ------------------------------------------------------------------ Triton outage


def test_triton_down_for_20_seconds_loses_nothing_and_memory_stays_bounded(
    kafka_bootstrap: str, own_triton: OwnTriton, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    # A Triton of this test's own, so stopping it does not disturb other tests.
    triton = own_triton.process
    max_pending = 1_000
    topo = write_topology(tmp_path, partitions=2, stage={"batching": {"max_pending_requests": max_pending}})
    n, rate = 9_000, 300.0
    records, features = _requests(n, seed=3, prefix="outage")
    with pipeline_process(topo, own_triton.env, tmp_path) as worker:
        producer = threading.Thread(
            target=lambda: asyncio.run(produce(kafka_bootstrap, topo.input_topic, records, rate=rate))
        )
        producer.start()
        time.sleep(5)
        baseline_rss = worker.rss_bytes()
        triton.stop()
        samples: list[tuple[int, float]] = []
        outage_end = time.monotonic() + 20
        while time.monotonic() < outage_end:
            samples.append((worker.rss_bytes(), worker.metric("pipeline_pending_requests")))
            time.sleep(0.5)
        paused = worker.metric("pipeline_consumer_paused")
        triton.start()
        producer.join(timeout=120)
        out = collect_outputs(kafka_bootstrap, topo, distinct_keys(n), timeout=180)
        retries = worker.metric("pipeline_triton_retries_total")
        assert worker.terminate() == 0, worker.log()

    assert out.on(topo.dead_letter_topic) == []
    counts = _check_results(out.on(topo.result_topic), features, "outage")
    assert set(counts) == {f"outage-{i}" for i in range(n)}, "lost requests"
    peak_rss = max(rss for rss, _ in samples)
    peak_pending = max(pending for _, pending in samples)
    record_property("rss_growth_mb", (peak_rss - baseline_rss) / 2**20)
    print(f"\noutage: peak pending {peak_pending:.0f}, RSS {baseline_rss / 2**20:.0f} -> {peak_rss / 2**20:.0f} MiB, {retries:.0f} retries")
    assert paused == 1, "the consumer should pause while Triton is down"
    assert peak_pending <= max_pending
    assert peak_rss - baseline_rss < 100 * 2**20, "worker memory grew during the outage"
    assert retries > 0


# ------------------------------------------------------------------ scale out


def test_second_process_joins_mid_stream_and_nothing_is_lost(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    """Scale-out is more processes in one consumer group: a join rebalances partitions
    while batches are in flight; the revoked side hands back and commits first."""
    topo = write_topology(tmp_path, partitions=4, stage={"warmup": True})
    records, features = _requests(12_000, seed=4, prefix="scale")
    with pipeline_process(topo, cli_env, tmp_path, stage="classify") as first:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records[:2_000], rate=1_000))
        with pipeline_process(topo, cli_env, tmp_path, stage="classify") as second:
            # Keep the stream flowing until the rebalance gave the second process work: how long
            # that takes depends on the machine's load, so the test waits for it, not a clock
            # (bounded: 60 s, then the test fails below with "got no work").
            n, deadline = 2_000, time.monotonic() + 60
            while n < len(records) and time.monotonic() < deadline:
                asyncio.run(produce(kafka_bootstrap, topo.input_topic, records[n : n + 500], rate=1_000))
                n += 500
                if second.metric("pipeline_results_total") > 0 and n >= 6_000:
                    break
            out = collect_outputs(kafka_bootstrap, topo, distinct_keys(n), timeout=120)
            shares = (first.metric("pipeline_results_total"), second.metric("pipeline_results_total"))
            assert second.terminate() == 0, second.log()
        assert first.terminate() == 0, first.log()
    assert out.on(topo.dead_letter_topic) == []
    counts = _check_results(out.on(topo.result_topic), features, "scale")
    assert set(counts) == {f"scale-{i}" for i in range(n)}
    assert shares[1] > 0, f"the second process got no work: {shares}"
    duplicates = sum(c - 1 for c in counts.values())
    record_property("duplicates_after_rebalance", duplicates)
    print(f"\nresults per process {shares}, duplicates {duplicates}")
