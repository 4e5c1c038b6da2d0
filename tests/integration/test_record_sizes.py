"""No record too large to get its outcome: `pipeline run` against the real broker, S3 and Triton.

Records are produced with librdkafka (the ``confluent-kafka`` wheel), a client that
shares no code with us, its ``message.max.bytes`` raised so it can send them. A dead
letter over the dead-letter limit (1 MiB) arrives as a claim check whose S3 object
holds the exact original value; a large valid request gets its result; a result too
large for any topic becomes a ``result-too-large`` claim check. The worker never exits
on any of them and answers the next request correctly.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord
from confluent_kafka import Producer

from pipeline.contract.headers import PROTOBUF_RESPONSE
from pipeline.contract.records import Record, read_claim_check, read_dead_letter
from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from pipeline.deadletter.claim_check import ClaimCheckStore
from pipeline.kafka.clients import RecordLimits
from pipeline.settings import S3Settings
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.kafka_io import header
from tests.helpers.record_fill import filled
from tests.helpers.topology_process import PipelineProcess, collect_outputs, pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

Rec = ConsumerRecord[bytes, bytes]
MiB = 1 << 20


def _rdkafka_produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    """Produce with librdkafka, in order, each acknowledged (raises on any delivery error)."""
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 64 * MiB, "linger.ms": 0})
    errors: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for record in records:
        producer.produce(topic, value=record.value, key=record.key, headers=record.headers, on_delivery=delivered)
        producer.flush(30)
    assert producer.flush(30) == 0 and not errors, errors


def _valid(correlation_id: str, features: np.ndarray, pad: int = 0, **headers: bytes) -> Record:
    """A valid JSON request; ``pad`` bytes of trailing whitespace make it large and still valid."""
    record = encode_request({"features": features}, correlation_id=correlation_id, form="json")
    extra = [(name.replace("_", "-"), value) for name, value in headers.items()]
    return Record(record.key, record.value + b" " * pad, [*record.headers, *extra])


def _result_just_over(max_record_bytes: int, features: np.ndarray) -> Record:
    """A protobuf request just under ``max_record_bytes`` (the topics' ``max.message.bytes``)
    whose result is over it (tests/helpers/record_fill.py)."""
    base = encode_request({"features": features}, correlation_id="huge-result")
    return Record(base.key, base.value, filled(base.key, base.value, list(base.headers), "app-blob", max_record_bytes))


def _json_headers(correlation_id: str) -> list[tuple[str, bytes]]:
    return [("content-type", b"application/json"), ("correlation-id", correlation_id.encode())]


def _by_key(records: list[Rec]) -> dict[bytes | None, Rec]:
    return {record.key: record for record in records}


def _check_result(record: Rec, correlation_id: str, features: np.ndarray) -> None:
    response = decode_response(record.value, record.headers)
    assert response.correlation_id == correlation_id
    np.testing.assert_allclose(response.outputs["logits"], mlp_reference(features), rtol=1e-4, atol=1e-5)


def _check_claim_check(record: Rec, s3: S3Settings, original: bytes, error_class: str) -> None:
    """An empty-valued dead letter whose claim check points at exactly ``original``."""
    assert record.value in (b"", None)
    failure = read_dead_letter(record.headers)
    assert failure.error_class == error_class, failure
    assert failure.stage == "classify" and failure.reason and failure.time_ms
    check = read_claim_check(record.headers)
    assert check is not None and check.stored, record.headers
    assert check.size == len(original)
    assert check.sha256 == hashlib.sha256(original).hexdigest()
    assert check.uri is not None and check.uri.startswith(f"s3://{s3.dead_letter_bucket}/")
    stored = ClaimCheckStore(s3).get(check.uri)
    assert hashlib.sha256(stored).hexdigest() == check.sha256 and stored == original


def _still_serving(worker: PipelineProcess) -> None:
    assert worker.proc is not None and worker.proc.poll() is None, worker.log()
    assert worker.get("/readyz")[0] == 200, worker.log()


def test_large_malformed_record_is_a_claim_check_and_the_worker_keeps_serving(
    kafka_bootstrap: str, cli_env: dict[str, str], s3_settings: S3Settings, tmp_path: Path
) -> None:
    """The probe of issue 9: 1.5 MB of malformed JSON to a dense topology (16 MiB requests)."""
    topo = write_topology(tmp_path, partitions=1)  # dense_classifier, max_request_bytes 16 MiB
    malformed = b'{"id": "big", "inputs": [' + b"1," * 750_000
    features = random_features(1, seed=11)
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        _rdkafka_produce(kafka_bootstrap, topo.input_topic, [Record(b"big", malformed, _json_headers("big"))])
        _rdkafka_produce(kafka_bootstrap, topo.input_topic, [_valid("after", features)])
        out = collect_outputs(kafka_bootstrap, topo, lambda rs: len(rs) >= 2, timeout=120)
        _still_serving(worker)
        assert worker.metric("pipeline_claim_checks_total") == 1
        assert worker.terminate(timeout=60) == 0, worker.log()

    dead = _by_key(out.on(topo.dead_letter_topic))
    assert set(dead) == {b"big"}
    _check_claim_check(dead[b"big"], s3_settings, malformed, "malformed-request")
    # Original headers stay on the record, for replay.
    assert header(dead[b"big"], "correlation-id") == "big"
    results = out.on(topo.result_topic)
    assert [r.key for r in results] == [b"after"]
    _check_result(results[0], "after", features)


def test_large_valid_request_oversized_request_and_oversized_result(
    kafka_bootstrap: str, cli_env: dict[str, str], s3_settings: S3Settings, tmp_path: Path
) -> None:
    """With ``max_request_bytes`` = 4 MiB: a 3 MB valid request (and a 1.5 MB header its
    result carries) is answered; 4 MiB + 1 bytes is an oversized-value claim check; a
    request whose carried header makes its result larger than any topic takes (4 MiB +
    1 MiB headroom, the topics' ``max.message.bytes``) is a result-too-large claim check of
    that result; a valid request after them all is answered."""
    limit = 4 * MiB
    topo = write_topology(tmp_path, partitions=1, stage={"max_request_bytes": limit})
    features = random_features(3, seed=12)
    large = _valid("large", features[0:1], pad=3_000_000, app_blob=b"b" * 1_500_000)
    oversized = json.dumps({"id": "over", "inputs": []}).encode()
    oversized += b" " * (limit + 1 - len(oversized))
    huge_header = _result_just_over(RecordLimits.for_values(limit, dead_letter_max_bytes=MiB).max_record_bytes, features[1:2])
    after = _valid("after", features[2:3])
    assert 3_000_000 < len(large.value) < limit and len(oversized) == limit + 1
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        _rdkafka_produce(
            kafka_bootstrap,
            topo.input_topic,
            [large, Record(b"over", oversized, _json_headers("over")), huge_header, after],
        )
        out = collect_outputs(kafka_bootstrap, topo, lambda rs: len(rs) >= 4, timeout=180)
        _still_serving(worker)
        assert worker.metric("pipeline_claim_checks_total") == 2
        assert worker.terminate(timeout=60) == 0, worker.log()

    results = _by_key(out.on(topo.result_topic))
    assert set(results) == {b"large", b"after"}
    _check_result(results[b"large"], "large", features[0:1])
    assert header(results[b"large"], "app-blob") == "b" * 1_500_000  # a 1.5 MB result left
    _check_result(results[b"after"], "after", features[2:3])

    dead = _by_key(out.on(topo.dead_letter_topic))
    assert set(dead) == {b"over", b"huge-result"}
    _check_claim_check(dead[b"over"], s3_settings, oversized, "oversized-value")
    # The result too large for any topic: its claim check holds the result itself.
    check = read_claim_check(dead[b"huge-result"].headers)
    assert check is not None and check.uri is not None
    stored = ClaimCheckStore(s3_settings).get(check.uri)
    _check_claim_check(dead[b"huge-result"], s3_settings, stored, "result-too-large")
    assert decode_response(stored, [("content-type", PROTOBUF_RESPONSE.encode())]).correlation_id == "huge-result"
