"""`pipeline replay` against the real broker, Triton and S3 store: dead letters go back and get their results.

Three stories an operator lives through:

* a stage deployed with the wrong model dead-letters every request (``unknown-model``);
  the topology is fixed and its worker restarted; ``--dry-run`` lists the dead letters
  and sends nothing; the replay sends each back to the topic it failed on and each
  gets its result (checked against a numpy reference), carrying ``replay-count: 1``;
* requests that can never succeed (a wrong shape) go round, ``replay-count`` rising on
  their dead letters, until ``--max-replays`` refuses them; a ``--group`` never redoes
  what it has replayed;
* a record too large for its topology is a claim check: its original comes back from
  the S3 store and, sent ``--to`` a topology that accepts it, arrives byte for byte.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord

from pipeline.contract.records import Record, read_claim_check, read_dead_letter, read_source
from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from pipeline.kafka.clients import RecordLimits, make_producer
from pipeline.settings import KafkaSettings
from tests.helpers.cli import ok, run_cli
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.kafka_io import collect, header, produce
from tests.helpers.topology_process import TopologyFiles, collect_outputs, pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.s3, pytest.mark.slow]

Rec = ConsumerRecord[bytes, bytes]
MiB = 1 << 20


def _request(correlation_id: str, features: np.ndarray[Any, Any], model_name: str = "") -> Record:
    return encode_request({"features": features}, correlation_id=correlation_id, form="json", model_name=model_name)


def _dead_letters(bootstrap: str, topo: TopologyFiles, count: int, timeout: float = 60) -> list[Rec]:
    out = collect_outputs(bootstrap, topo, lambda rs: len([r for r in rs if r.topic == topo.dead_letter_topic]) >= count, timeout)
    return out.on(topo.dead_letter_topic)


def _records_on(bootstrap: str, topic: str, expected: int) -> int:
    """How many records ``topic`` holds: read from the beginning until more than
    ``expected`` arrive or a few quiet seconds pass (Tansu's end offsets count batches)."""
    found = asyncio.run(collect(bootstrap, [topic], done=lambda rs: len(rs) > expected, timeout=5))
    return len(found.records)


def _replay(env: dict[str, str], topo: TopologyFiles, *args: str) -> str:
    result = ok(run_cli(env, "replay", "--topology", str(topo.path), *args))
    print(result.stdout)
    return result.stdout


def _summary(stdout: str) -> dict[str, int]:
    """The counts of the summary line: read, selected, sent / would send, refused, failed."""
    line = next(line for line in stdout.splitlines() if ": read " in line)
    found = re.findall(r"(read|selected|sent|would send|refused by max count|failed|already answered) (\d+)", line)
    return {name: int(n) for name, n in found}


def test_wrong_model_dead_letters_are_replayed_after_the_fix_and_each_gets_its_result(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_topology(tmp_path, partitions=2, stage={"model": "anomaly_score"})  # the deployment mistake
    features = random_features(6, seed=41)
    ids = [f"replay-{i}" for i in range(6)]
    requests = [_request(cid, features[i : i + 1], model_name="dense_classifier") for i, cid in enumerate(ids)]
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, requests))
        dead = _dead_letters(kafka_bootstrap, topo, 6)
        assert worker.terminate() == 0, worker.log()
    assert sorted(r.key for r in dead) == sorted(cid.encode() for cid in ids)
    for record in dead:
        assert read_dead_letter(record.headers).error_class == "unknown-model"
        source = read_source(record.headers)
        assert source is not None and source.topic == topo.input_topic and source.offset is not None

    # The fix: the same topology (topics, group) serving the right model.
    topo.path.write_text(topo.path.read_text().replace("anomaly_score", "dense_classifier"))

    listed = _replay(cli_env, topo, "--dry-run")
    assert _summary(listed) == {"read": 6, "selected": 6, "would send": 6, "refused by max count": 0, "failed": 0}
    for cid in ids:
        row = next(line for line in listed.splitlines() if f" {cid} " in line)
        assert "unknown-model" in row and topo.input_topic in row and "would send" in row, row
    assert _records_on(kafka_bootstrap, topo.input_topic, 6) == 6, "a dry run sends nothing"
    one = _replay(cli_env, topo, "--dry-run", "--key", "replay-3", "--error-class", "unknown-model", "--since", "1h")
    assert _summary(one)["selected"] == 1 and _summary(_replay(cli_env, topo, "--dry-run", "--until", "1h"))["selected"] == 0

    with pipeline_process(topo, cli_env, tmp_path) as worker:
        sent = _replay(cli_env, topo, "--rate", "50")
        assert _summary(sent) == {"read": 6, "selected": 6, "sent": 6, "refused by max count": 0, "failed": 0}
        out = collect_outputs(kafka_bootstrap, topo, lambda rs: len([r for r in rs if r.topic == topo.result_topic]) >= 6, 90)
        assert worker.terminate() == 0, worker.log()

    results = {r.key: r for r in out.on(topo.result_topic)}
    assert set(results) == {cid.encode() for cid in ids}, "every dead letter got its result"
    for i, cid in enumerate(ids):
        record = results[cid.encode()]
        assert header(record, "replay-count") == "1"
        response = decode_response(record.value, record.headers)
        assert response.correlation_id == cid
        np.testing.assert_allclose(response.outputs["logits"], mlp_reference(features[i : i + 1]), rtol=1e-4, atol=1e-5)
    assert len(out.on(topo.dead_letter_topic)) == 6, "nothing dead-lettered again"

    # Issue 26: each of these requests has its result now; replaying the dead letters again
    # would answer them twice, so they are listed as answered and nothing is sent.
    again = _replay(cli_env, topo)
    assert _summary(again) == {
        "read": 6, "selected": 6, "sent": 0, "refused by max count": 0, "failed": 0, "already answered": 6
    }, again
    assert _records_on(kafka_bootstrap, topo.input_topic, 12) == 12, "the 6 requests and their one replay each, no more"
    assert _summary(_replay(cli_env, topo, "--dry-run", "--replay-answered"))["would send"] == 6, "unless asked to"


def test_a_record_that_always_fails_stops_at_max_replays(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_topology(tmp_path, partitions=2)
    wrong = np.zeros((1, 8), np.float32)  # dense_classifier takes 16 features: shape-mismatch, always
    requests = [_request(f"loop-{i}", wrong) for i in range(3)]
    group = f"{topo.name}.replay"
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, requests))
        _dead_letters(kafka_bootstrap, topo, 3)
        for round_, expected in ((1, 6), (2, 9)):
            summary = _summary(_replay(cli_env, topo, "--group", group, "--max-replays", "2"))
            assert summary == {"read": 3, "selected": 3, "sent": 3, "refused by max count": 0, "failed": 0}, round_
            dead = _dead_letters(kafka_bootstrap, topo, expected)
        refused = _replay(cli_env, topo, "--group", group, "--max-replays", "2")
        assert _summary(refused) == {"read": 3, "selected": 3, "sent": 0, "refused by max count": 3, "failed": 0}
        assert refused.count("refused: replayed 2 time(s) already (--max-replays 2)") == 3, refused
        assert _summary(_replay(cli_env, topo, "--group", group))["read"] == 0, "the group has read them all"
        assert worker.terminate() == 0, worker.log()

    assert len(dead) == 9 and _records_on(kafka_bootstrap, topo.input_topic, 9) == 9
    counts = sorted(header(r, "replay-count") or "0" for r in dead)
    assert counts == ["0"] * 3 + ["1"] * 3 + ["2"] * 3, "each failure's dead letter carries its replay count"
    assert {read_dead_letter(r.headers).error_class for r in dead} == {"shape-mismatch"}
    whole = _summary(_replay(cli_env, topo, "--dry-run", "--max-replays", "2"))  # no group: the whole topic
    assert whole == {"read": 9, "selected": 9, "would send": 6, "refused by max count": 3, "failed": 0}


def test_claim_check_is_replayed_byte_for_byte_to_a_topic_that_accepts_it(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    small = write_topology(tmp_path, partitions=1, stage={"max_request_bytes": MiB})
    large = write_topology(tmp_path, partitions=1, stage={"max_request_bytes": 4 * MiB})
    features = random_features(1, seed=43)
    request = _request("big-one", features)
    original = Record(request.key, request.value + b" " * (MiB + 1 - len(request.value)), [*request.headers, ("app", b"\x00\xff")])

    async def send_large() -> None:
        producer = make_producer(KafkaSettings(bootstrap_servers=kafka_bootstrap), limits=RecordLimits(8 * MiB, 8 * MiB))
        await producer.start()
        try:
            await (await producer.send(small.input_topic, original.value, key=original.key, headers=original.headers))
        finally:
            await producer.stop()

    with pipeline_process(small, cli_env, tmp_path) as worker:
        asyncio.run(send_large())
        [dead] = _dead_letters(kafka_bootstrap, small, 1)
        assert worker.terminate() == 0, worker.log()
    assert read_dead_letter(dead.headers).error_class == "oversized-value"
    check = read_claim_check(dead.headers)
    assert check is not None and check.stored and check.size == len(original.value) and dead.value in (b"", None)

    with pipeline_process(large, cli_env, tmp_path) as worker:
        summary = _summary(_replay(cli_env, small, "--to", large.input_topic))
        assert summary == {"read": 1, "selected": 1, "sent": 1, "refused by max count": 0, "failed": 0}
        out = collect_outputs(kafka_bootstrap, large, lambda rs: len(rs) >= 1, 90)
        assert worker.terminate() == 0, worker.log()

    replayed = asyncio.run(collect(kafka_bootstrap, [large.input_topic], done=lambda rs: len(rs) >= 1, timeout=30)).records
    assert len(replayed) == 1
    assert replayed[0].key == original.key and replayed[0].value == original.value, "the original bytes"
    assert list(replayed[0].headers) == [*original.headers, ("replay-count", b"1")]
    [result] = out.on(large.result_topic)
    response = decode_response(result.value, result.headers)
    assert response.correlation_id == "big-one" and header(result, "replay-count") == "1"
    np.testing.assert_allclose(response.outputs["logits"], mlp_reference(features), rtol=1e-4, atol=1e-5)
