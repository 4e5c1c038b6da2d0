"""Records the consumer cannot decode are dead-lettered by position, and consumption goes on.

Against the real broker and a running `pipeline run`: a record whose header key
is not UTF-8 (b"\\xff\\xfe") and a record batch with a wrong CRC, both accepted and
stored by the broker as sent (Tansu does not validate either on produce; Apache
Kafka refuses a bad CRC with CORRUPT_MESSAGE, but may still serve one from a
damaged disk), between valid requests on three partitions. Everything is produced
before the worker starts, so its first fetches carry every partition at once
(the case where a failed ``getmany`` had already drained the others: they are sought back).
On Tansu (``tansu_bootstrap``: the session's, or one of its own when the suite runs on Apache Kafka).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.contract.records import Record, read_dead_letter
from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from pipeline.kafka.clients import ensure_topics
from pipeline.settings import KafkaSettings
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.kafka_io import header, produce
from tests.helpers.raw_records import RawKey, RawRecord, build_batch, produce_raw_batch
from tests.helpers.topology_process import TopologyFiles, collect_outputs, pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

Rec = ConsumerRecord[bytes, bytes]
FEATURES = random_features(40, seed=91)


def _request(i: int) -> Record:
    return encode_request({"features": FEATURES[i : i + 1]}, correlation_id=f"u-{i}")


def _raw(i: int, *, bad_key: bool = False) -> RawRecord:
    record = _request(i)
    extra = [(RawKey(b"\xff\xfe"), b"x")] if bad_key else [("app", b"y")]
    return RawRecord(record.key, record.value, list(record.headers) + extra)


def _check_results(results: list[Rec]) -> Counter[str]:
    seen: Counter[str] = Counter()
    for record in results:
        response = decode_response(record.value, record.headers)
        i = int(response.correlation_id.removeprefix("u-"))
        np.testing.assert_allclose(response.outputs["logits"], mlp_reference(FEATURES[i : i + 1]), rtol=1e-4, atol=1e-5)
        seen[response.correlation_id] += 1
    return seen


async def _produce_everything(bootstrap: str, topo: TopologyFiles) -> dict[str, tuple[int, int]]:
    """Valid requests u-0..u-9, the two raw batches, valid u-20..u-29; returns where the bad ones are."""
    await ensure_topics(KafkaSettings(bootstrap_servers=bootstrap), [topo.input_topic], partitions=3)
    await produce(bootstrap, topo.input_topic, [_request(i) for i in range(10)])
    p0, p1 = TopicPartition(topo.input_topic, 0), TopicPartition(topo.input_topic, 1)
    # Partition 0: valid, bad header key, valid, in one batch (u-10, u-11, u-12).
    base0 = await produce_raw_batch(bootstrap, p0, build_batch([_raw(10), _raw(11, bad_key=True), _raw(12)]))
    # Partition 1: a batch of two valid requests whose CRC is wrong (u-13, u-14).
    base1 = await produce_raw_batch(bootstrap, p1, build_batch([_raw(13), _raw(14)], corrupt_crc=True))
    await produce(bootstrap, topo.input_topic, [_request(i) for i in range(20, 30)])
    return {"u-11": (0, base0 + 1), "u-13": (1, base1), "u-14": (1, base1 + 1)}


def test_unreadable_records_are_dead_lettered_by_position_and_the_worker_goes_on(
    tansu_bootstrap: str, tansu_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_topology(tmp_path, partitions=3)  # partition 2: valid records only
    bad = asyncio.run(_produce_everything(tansu_bootstrap, topo))
    readable = {f"u-{i}" for i in [*range(10), 10, 12, *range(20, 30)]}

    with pipeline_process(topo, tansu_env, tmp_path) as worker:
        out = collect_outputs(tansu_bootstrap, topo, lambda rs: len(rs) >= len(readable) + 3, timeout=120)
        assert worker.metric("pipeline_unreadable_records_total") == 3, worker.log()
        assert worker.proc is not None and worker.proc.poll() is None, worker.log()
        assert worker.get("/readyz")[0] == 200
        assert worker.terminate(timeout=60) == 0, worker.log()

    # Every readable request has exactly one correct result, the two beside the bad one included.
    assert _check_results(out.on(topo.result_topic)) == Counter(readable)
    # Each unreadable record is exactly one dead letter naming its partition and offset.
    letters = out.on(topo.dead_letter_topic)
    assert len(letters) == 3
    by_position = {(int(header(r, "source-partition") or -1), int(header(r, "source-offset") or -1)): r for r in letters}
    assert set(by_position) == set(bad.values())
    for cid, position in bad.items():
        letter = by_position[position]
        assert header(letter, "source-topic") == topo.input_topic
        assert letter.key == cid.encode()  # what could be read is kept
        failure = read_dead_letter(letter.headers)
        assert failure.error_class == "unreadable-record" and failure.stage == "classify"
        if cid == "u-11":
            assert "\\xff\\xfe" in failure.reason
            assert ("\\xff\\xfe", b"x") in list(letter.headers)  # the key, escaped; its value as sent
            assert letter.value == _request(11).value
        else:
            assert "CRC" in failure.reason

    # A restart meets none of them again: their offsets were committed like any other.
    asyncio.run(produce(tansu_bootstrap, topo.input_topic, [_request(i) for i in range(30, 35)]))
    with pipeline_process(topo, tansu_env, tmp_path) as again:
        later = collect_outputs(
            tansu_bootstrap, topo, lambda rs: len(rs) >= len(readable) + 3 + 5, timeout=120
        )
        assert again.metric("pipeline_unreadable_records_total") == 0, again.log()
        assert again.terminate(timeout=60) == 0, again.log()
    assert len(later.on(topo.dead_letter_topic)) == 3
    assert _check_results(later.on(topo.result_topic)) == Counter(readable | {f"u-{i}" for i in range(30, 35)})
