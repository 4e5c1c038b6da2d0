"""pipeline.client against the real stack: `pipeline run` processes, the broker, Triton.

Requests go through the client library exactly as a user's code would send them; what
comes back is checked against the numpy reference of the model, and what the reply
topics hold is read back with a plain consumer.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.client import Client, InferResult, RequestDeadLettered, RequestTimedOut, SyncClient
from pipeline.contract.reply import REPLY_TOPIC
from pipeline.contract.request import encode_request
from pipeline.settings import KafkaSettings
from tests.helpers.cli import ok, run_cli
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.kafka_io import collect, header, produce, topic_names
from tests.helpers.streams import AUDIO_STAGES, expected, utterance
from tests.helpers.topology_process import pipeline_process, write_topology
from tests.helpers.vad_reference import CHUNK

pytestmark = [pytest.mark.kafka, pytest.mark.triton]


def _kafka(bootstrap: str) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=bootstrap)


def _check_logits(result: InferResult, features: np.ndarray) -> None:
    np.testing.assert_allclose(result.outputs["logits"], mlp_reference(features), rtol=1e-4, atol=1e-5)


def test_two_clients_get_exactly_their_own_results(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_topology(tmp_path, partitions=4)
    features = random_features(1000, seed=13).reshape(1000, 1, 16)

    async def scenario() -> None:
        async with (
            Client(topo.path, kafka=_kafka(kafka_bootstrap), timeout=60) as a,
            Client(topo.path, kafka=_kafka(kafka_bootstrap), timeout=60) as b,
        ):
            calls = [(a if i % 2 == 0 else b).infer({"features": features[i]}) for i in range(1000)]
            results = await asyncio.gather(*calls)
            for i, result in enumerate(results):
                owner = a if i % 2 == 0 else b
                assert result.correlation_id.startswith(owner.client_id), i
                assert result.model_name == "dense_classifier" and result.headers["pipeline-stage"] == "classify"
                _check_logits(result, features[i])
            for client in (a, b):
                assert client.stats.results == 500 and client.stats.foreign == 0 and client.stats.late == 0
                assert client.reply_topic is not None
                held = await collect(kafka_bootstrap, [client.reply_topic], done=lambda rs: len(rs) >= 500, timeout=30)
                assert len(held.records) == 500
                assert all((header(r, "correlation-id") or "").startswith(client.client_id) for r in held.records)
            # The shared result topic got none of them: every result went to its caller.
            shared = await collect(kafka_bootstrap, [topo.result_topic], done=lambda rs: False, timeout=2)
            assert shared.records == []

    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(scenario())
        assert worker.metric("pipeline_reply_routes_total", stage="classify", outcome="honoured") == 1000


def test_bad_requests_raise_the_dead_letter_and_a_timed_out_call_discards_its_late_reply(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_topology(tmp_path, partitions=2)

    async def before_the_topology_runs(client: Client) -> None:
        with pytest.raises(RequestTimedOut) as timed_out:
            await client.infer({"features": random_features(1, seed=1)}, timeout=1.0)
        assert isinstance(timed_out.value, asyncio.TimeoutError)
        assert client.stats.timed_out == 1 and client.waiters.waiting == 0

    async def once_it_runs(client: Client) -> None:
        # The late call's outcome (its deadline passed: a dead letter) is read and discarded.
        for _ in range(300):
            if client.stats.late >= 1:
                break
            await asyncio.sleep(0.2)
        assert client.stats.late == 1 and client.stats.dead_letters == 0
        with pytest.raises(RequestDeadLettered) as wrong_name:
            await client.infer({"wrong": random_features(1, seed=2)}, timeout=30)
        assert wrong_name.value.stage == "classify"
        assert wrong_name.value.error_class in ("unknown-input", "missing-input")
        with pytest.raises(RequestDeadLettered) as wrong_shape:
            await client.infer({"features": np.zeros((1, 3), np.float32)}, timeout=30)
        assert (wrong_shape.value.stage, wrong_shape.value.error_class) == ("classify", "shape-mismatch")
        ok = await client.infer({"features": random_features(1, seed=3)}, timeout=30)
        _check_logits(ok, random_features(1, seed=3))
        assert client.stats.late == 1  # nothing else was discarded

    async def scenario() -> None:
        async with Client(topo.path, kafka=_kafka(kafka_bootstrap)) as client:
            await before_the_topology_runs(client)
            with pipeline_process(topo, cli_env, tmp_path):
                await once_it_runs(client)

    asyncio.run(scenario())
    late = asyncio.run(collect(kafka_bootstrap, [topo.dead_letter_topic], done=lambda rs: len(rs) >= 3, timeout=10))
    assert "deadline-exceeded" in {header(r, "error-class") for r in late.records}


def test_infer_many_in_order_shared_mode_sync_client_and_a_refused_reply_topic(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_topology(tmp_path, partitions=2)
    features = random_features(200, seed=5).reshape(200, 1, 16)

    async def many() -> None:
        async with Client(topo.path, kafka=_kafka(kafka_bootstrap), timeout=60) as client:
            results = [r async for r in client.infer_many([{"features": f} for f in features], max_in_flight=16)]
            assert len(results) == 200
            for row, result in zip(features, results, strict=True):
                assert isinstance(result, InferResult)
                _check_logits(result, row)

    async def outside_the_prefix() -> None:
        async with Client(topo.path, kafka=_kafka(kafka_bootstrap), reply="shared", timeout=60) as client:
            cid = client.next_id()
            record = encode_request(
                {"features": features[0]},
                correlation_id=cid,
                extra_headers=[(REPLY_TOPIC, f"{topo.name}.elsewhere".encode())],
            )
            result = await client.call(record, cid, 60)  # read from the result topic: not rerouted
            assert result.topic == topo.result_topic
            _check_logits(result, features[0])

    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(many())
        asyncio.run(outside_the_prefix())
        with SyncClient(topo.path, kafka=_kafka(kafka_bootstrap), timeout=60) as sync:
            one = sync.infer({"features": features[1]})
            _check_logits(one, features[1])
            listed = sync.infer_many([{"features": f} for f in features[:10]], max_in_flight=4)
            for row, result in zip(features[:10], listed, strict=True):
                assert isinstance(result, InferResult)
                _check_logits(result, row)
        assert worker.metric("pipeline_reply_routes_total", stage="classify", outcome="outside-prefix") == 1
        assert worker.metric("pipeline_reply_routes_total", stage="classify", outcome="honoured") == 211


@pytest.mark.slow
def test_audio_stream_session_yields_the_reference_probabilities(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_topology(tmp_path, partitions=2, stages=AUDIO_STAGES)
    audio = utterance(0)
    pieces = [audio[i : i + CHUNK] for i in range(0, len(audio), CHUNK)]
    want = expected(0)

    async def scenario(key: str, reply: str) -> dict[str, list[InferResult]]:
        got: dict[str, list[InferResult]] = {}
        async with (
            Client(topo.path, kafka=_kafka(kafka_bootstrap), timeout=60, reply=reply) as client,
            client.stream(key) as stream,
        ):

            async def send() -> None:
                for i, piece in enumerate(pieces):
                    await stream.send(piece, last=i == len(pieces) - 1, sample_rate=16000)

            sender = asyncio.create_task(send())
            async for result in stream.results():
                got.setdefault(result.result_type or "?", []).append(result)
            await sender
        return got

    with pipeline_process(topo, cli_env, tmp_path):
        got = asyncio.run(scenario("client-stream-1", "topic"))
        # The same stream again in shared mode: its results land on the result topic, where
        # `pipeline consume` shows them to a person; both must show the same numbers.
        shared = asyncio.run(scenario("client-stream-2", "shared"))
        shown = ok(
            run_cli(
                cli_env,
                "consume",
                "--topology",
                str(topo.path),
                "--from-beginning",
                "--json",
                "--values",
                "0",
                "--timeout",
                "3",
            )
        )
    for results in (got, shared):
        chunks = results["chunk"]
        assert [r.chunk_index for r in chunks] == list(range(want.chunks))
        probabilities = np.concatenate([r.outputs["probability"].reshape(-1) for r in chunks])
        np.testing.assert_allclose(probabilities, want.probabilities, atol=1e-5)
        segments = [(float(r.outputs["start_s"][0]), float(r.outputs["end_s"][0])) for r in results["segment"]]
        np.testing.assert_allclose(segments, want.segments, atol=1e-9)
        assert len(results["summary"]) == 1
    lines = [json.loads(line) for line in shown.stdout.splitlines() if line.startswith("{")]
    consumed = [d for d in lines if d.get("key") == "client-stream-2" and "probability" in d.get("outputs", {})]
    assert len(consumed) == want.chunks, "pipeline consume shows every chunk result of the shared stream"
    np.testing.assert_array_equal(
        np.concatenate([np.asarray(d["outputs"]["probability"]["values"], np.float32) for d in consumed]),
        np.concatenate([r.outputs["probability"].reshape(-1) for r in shared["chunk"]]),
    )
    assert not any(d.get("key") == "client-stream-1" for d in lines), (
        "a reply-topic stream never reaches the result topic"
    )


def test_a_closed_clients_reply_topic_is_not_created_again_and_late_results_reach_the_result_topic(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """A client closes while requests of its are still to be answered: it deletes its reply
    topic, and the broker (Apache Kafka, whose ``auto.create.topics.enable`` is on by default,
    as in the embedded stack) would create it again on the first metadata request that names
    it. The result stage never asks to create a topic: the late results go to the result
    topic, counted ``unknown-topic`` or ``unreachable``, and the reply topic stays gone."""
    topo = write_topology(tmp_path, partitions=2)
    features = random_features(6, seed=21).reshape(6, 1, 16)

    async def scenario() -> tuple[str, list[str]]:
        async with Client(topo.path, kafka=_kafka(kafka_bootstrap), timeout=60) as client:
            _check_logits(await client.infer({"features": features[0]}), features[0])  # the stage now knows the topic
            reply_topic = client.reply_topic
            assert reply_topic is not None
            late = [client.next_id() for _ in range(5)]
        assert reply_topic not in await topic_names(kafka_bootstrap), "the client deletes its reply topic on close"
        records = [
            encode_request(
                {"features": features[i + 1]}, correlation_id=cid, extra_headers=[(REPLY_TOPIC, reply_topic.encode())]
            )
            for i, cid in enumerate(late)
        ]
        await produce(kafka_bootstrap, topo.input_topic, records)
        got = await collect(kafka_bootstrap, [topo.result_topic], done=lambda rs: len(rs) >= 5, timeout=60)
        assert sorted(header(r, "correlation-id") or "" for r in got.records) == sorted(late)
        return reply_topic, late

    with pipeline_process(topo, cli_env, tmp_path) as worker:
        reply_topic, _late = asyncio.run(scenario())
        routes = {
            outcome: worker.metric("pipeline_reply_routes_total", stage="classify", outcome=outcome)
            for outcome in ("honoured", "unknown-topic", "unreachable")
        }
        # ``unreachable``: honoured from metadata read before the deletion, then sent back
        # (counted under both); ``unknown-topic``: known missing before it was routed.
        assert routes["unknown-topic"] + routes["unreachable"] == 5, routes
        assert routes["honoured"] - routes["unreachable"] == 1, routes
    assert reply_topic not in asyncio.run(topic_names(kafka_bootstrap)), "the reply topic was created again"
