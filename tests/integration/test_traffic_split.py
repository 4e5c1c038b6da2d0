"""Several models behind one stateless stage, on the real stack: `pipeline run` in a subprocess,
the session's broker and Triton (dense_classifier and anomaly_score, which read the same
``features`` FP32 [16] request), records produced and collected with plain aiokafka.

- weighted routes: a 90/10 split over 10,000 requests holds within a 4-sigma binomial bound,
  every key is served by one route only, results name their route (``pipeline-route``) and
  model, and the per-route metrics count what the result topic holds;
- shadow: its results reach the shadow topic only; the result topic has exactly one result
  per request; a shadow model Triton does not have changes nothing for the main route and
  is counted (``pipeline_shadow_total{outcome="failed"}``);
- task routes: the ``task`` header picks the model; a missing or unknown task is
  dead-lettered ``unknown-task``.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord

from pipeline.contract.records import Record, read_dead_letter
from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.figures import FaultFigures, report
from tests.helpers.kafka_io import collect, header, produce
from tests.helpers.topology_process import TopologyFiles, pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

Rec = ConsumerRecord[bytes, bytes]
ROUTES = [
    {"name": "stable", "model": "dense_classifier", "weight": 90},
    {"name": "canary", "model": "anomaly_score", "weight": 10},
]
MODEL_OF = {"stable": "dense_classifier", "canary": "anomaly_score"}


def _requests(keys: list[str], seed: int, prefix: str) -> tuple[list[Record], np.ndarray]:
    features = random_features(len(keys), seed)
    records = [
        replace(encode_request({"features": features[i : i + 1]}, correlation_id=f"{prefix}-{i}"), key=key.encode())
        for i, key in enumerate(keys)
    ]
    return records, features


def _collect(bootstrap: str, topics: list[str], n: int, timeout: float = 240) -> dict[str, list[Rec]]:
    """Read ``topics`` until the first two hold ``n`` records together (results + dead letters)."""
    done = lambda records: sum(1 for r in records if r.topic in topics[:2]) >= n  # noqa: E731
    collected = asyncio.run(collect(bootstrap, topics, done=done, timeout=timeout))
    return {topic: collected.on(topic) for topic in topics}


def _topology(tmp_path: Path, **changes: object) -> TopologyFiles:
    """One stage named ``score``; ``model=""`` with ``routes`` (the helper's default model is dense_classifier)."""
    return write_topology(tmp_path, stage={"name": "score", **changes})


def test_weighted_routes_split_sticky_by_key_and_the_shadow_stays_on_its_topic(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """10,000 requests: 8,000 keys seen once (the weight check: keys are what is split) and
    100 keys seen 20 times each (the stickiness check), shuffled together."""
    topo = _topology(tmp_path, model="", routes=ROUTES, shadow={"model": "anomaly_score", "max_inflight": 8})
    shadow_topic = f"{topo.result_topic}.shadow"
    keys = [f"once-{i}" for i in range(8000)] + [f"user-{i % 100}" for i in range(2000)]
    np.random.default_rng(7).shuffle(keys)
    records, features = _requests(keys, seed=7, prefix="w")
    n = len(records)
    with pipeline_process(topo, cli_env, tmp_path) as proc:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        got = _collect(kafka_bootstrap, [topo.result_topic, topo.dead_letter_topic, shadow_topic], n)
        # The shadow is best effort and off the main path: wait for its tally to settle.
        for _ in range(100):
            outcomes = {o: proc.metric("pipeline_shadow_total", stage="score", outcome=o) for o in ("sent", "failed", "dropped")}
            if sum(outcomes.values()) >= n:
                break
            asyncio.run(asyncio.sleep(0.2))
        route_requests = {r: proc.metric("pipeline_route_requests_total", stage="score", route=r) for r in MODEL_OF}
        route_calls = {r: proc.metric("pipeline_route_request_duration_seconds_count", stage="score", route=r) for r in MODEL_OF}
        # After that burst (most copies dropped: the shadow never holds the main route back),
        # the shadow is free again: a paced stream is mirrored.
        paced, _ = _requests([f"paced-{i}" for i in range(300)], seed=8, prefix="p")
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, paced, rate=300))
        everything = _collect(kafka_bootstrap, [topo.result_topic, topo.dead_letter_topic], n + len(paced))
        for _ in range(100):
            after = {o: proc.metric("pipeline_shadow_total", stage="score", outcome=o) for o in ("sent", "failed", "dropped")}
            if sum(after.values()) >= n + len(paced):
                break
            asyncio.run(asyncio.sleep(0.2))
    shadow_records = asyncio.run(
        collect(kafka_bootstrap, [shadow_topic], done=lambda rs: len(rs) >= after["sent"], timeout=60)
    ).records

    results, dead = got[topo.result_topic], got[topo.dead_letter_topic]
    assert dead == []
    ids = [decode_response(r.value, r.headers).correlation_id for r in results]
    assert sorted(ids) == sorted(f"w-{i}" for i in range(n)), "exactly one result per request"
    served_by: dict[str, set[str]] = defaultdict(set)
    per_route: Counter[str] = Counter()
    for record in results:
        route = header(record, "pipeline-route")
        assert route in MODEL_OF, f"a result from route {route!r} (the shadow's?) on the result topic"
        assert header(record, "model-name") == MODEL_OF[route]
        response = decode_response(record.value, record.headers)
        index = int(response.correlation_id.removeprefix("w-"))
        if route == "stable":
            np.testing.assert_allclose(
                response.outputs["logits"], mlp_reference(features[index : index + 1]), rtol=1e-4, atol=1e-5
            )
        else:
            assert response.outputs["score"].shape == (1, 1)
        served_by[record.key.decode()].add(route)
        per_route[route] += 1

    # Stickiness: every key, the 100 repeated ones included, was served by one route.
    assert all(len(routes) == 1 for routes in served_by.values())
    assert sum(1 for k in served_by if k.startswith("user-")) == 100
    # Weights: keys are Bernoulli(0.1) trials for the canary.
    canary_keys = sum(1 for routes in served_by.values() if routes == {"canary"})
    trials = len(served_by)
    bound = 4 * math.sqrt(trials * 0.1 * 0.9)
    assert abs(canary_keys - 0.1 * trials) < bound, (canary_keys, trials, bound)
    # The metrics say what the result topic holds.
    assert route_requests == {r: float(per_route[r]) for r in MODEL_OF}
    assert all(route_calls[r] > 0 for r in MODEL_OF)

    # The shadow: its own topic only, marked, every copy accounted for.
    assert sum(outcomes.values()) == n, outcomes
    assert outcomes["sent"] > 0 and outcomes["failed"] == 0
    assert len(shadow_records) == after["sent"]  # burst and paced copies: each once, none lost
    assert {header(r, "pipeline-route") for r in shadow_records} == {"shadow"}
    assert {header(r, "model-name") for r in shadow_records} == {"anomaly_score"}
    shadow_ids = {decode_response(r.value, r.headers).correlation_id for r in shadow_records}
    assert shadow_ids <= set(ids) | {f"p-{i}" for i in range(len(paced))}
    both = [decode_response(r.value, r.headers).correlation_id for r in everything[topo.result_topic]]
    assert everything[topo.dead_letter_topic] == [] and len(both) == len(set(both)) == n + len(paced)
    paced_sent = after["sent"] - outcomes["sent"]
    assert sum(after.values()) == n + len(paced) and paced_sent >= len(paced) / 2, after
    report(
        FaultFigures(
            "weighted routes 90/10 + shadow", topo.name, sent=n, results=len(results), duplicates=0,
            exact_duplicates=True, dead_letters=0, lost=n - len(set(ids)),
            note=(
                f"requests stable {per_route['stable']} / canary {per_route['canary']}; canary keys "
                f"{canary_keys} of {trials} (expected {0.1 * trials:.0f} +- {bound:.0f}); shadow sent "
                f"{outcomes['sent']:.0f}, dropped {outcomes['dropped']:.0f}, failed {outcomes['failed']:.0f} "
                f"in the burst; then 300 paced at 300/s: shadow sent {paced_sent:.0f}"
            ),
        )
    )


def test_a_shadow_model_triton_does_not_have_changes_nothing_for_the_main_route(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    missing = f"not_loaded_{uuid.uuid4().hex[:8]}"
    topo = _topology(tmp_path, model="dense_classifier", shadow={"model": missing})
    shadow_topic = f"{topo.result_topic}.shadow"
    n = 1000
    records, features = _requests([f"k-{i}" for i in range(n)], seed=11, prefix="s")
    with pipeline_process(topo, cli_env, tmp_path) as proc:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        got = _collect(kafka_bootstrap, [topo.result_topic, topo.dead_letter_topic, shadow_topic], n)
        failed = proc.metric("pipeline_shadow_total", stage="score", outcome="failed")
        sent = proc.metric("pipeline_shadow_total", stage="score", outcome="sent")
        assert "shadow model " + missing in proc.log()
    results, dead = got[topo.result_topic], got[topo.dead_letter_topic]
    assert dead == []
    assert sorted(decode_response(r.value, r.headers).correlation_id for r in results) == sorted(
        f"s-{i}" for i in range(n)
    )
    for record in results:
        assert header(record, "model-name") == "dense_classifier"
        assert header(record, "pipeline-route") is None  # one model: no route to name
        index = int(decode_response(record.value, record.headers).correlation_id.removeprefix("s-"))
        np.testing.assert_allclose(
            decode_response(record.value, record.headers).outputs["logits"],
            mlp_reference(features[index : index + 1]), rtol=1e-4, atol=1e-5,
        )
    assert got[shadow_topic] == []
    assert (failed, sent) == (n, 0)
    report(
        FaultFigures(
            "shadow model missing", topo.name, sent=n, results=len(results), duplicates=0, exact_duplicates=True,
            dead_letters=0, lost=0, note=f"pipeline_shadow_total failed {failed:.0f}, sent {sent:.0f}",
        )
    )


def test_task_header_selects_the_model_and_an_unknown_task_is_dead_lettered(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    routes = [{"name": "classify", "model": "dense_classifier"}, {"name": "score", "model": "anomaly_score"}]
    topo = _topology(tmp_path, model="", routes=routes, route_by="task")
    tasks = ["classify", "score", "translate", None] * 50
    records, _ = _requests([f"t-{i}" for i in range(len(tasks))], seed=3, prefix="t")
    records = [
        r if task is None else replace(r, headers=[*r.headers, ("task", task.encode())])
        for r, task in zip(records, tasks, strict=True)
    ]
    with pipeline_process(topo, cli_env, tmp_path) as proc:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        got = _collect(kafka_bootstrap, [topo.result_topic, topo.dead_letter_topic], len(records))
        per_route = {r: proc.metric("pipeline_route_requests_total", stage="score", route=r) for r in ("classify", "score")}
    task_of = {f"t-{i}": task for i, task in enumerate(tasks)}
    results, dead = got[topo.result_topic], got[topo.dead_letter_topic]
    assert len(results) == 100 and len(dead) == 100
    for record in results:
        task = task_of[decode_response(record.value, record.headers).correlation_id]
        assert header(record, "pipeline-route") == task
        assert header(record, "model-name") == {"classify": "dense_classifier", "score": "anomaly_score"}[task]
    reasons: Counter[str] = Counter()
    for record in dead:
        letter = read_dead_letter(record.headers)
        assert letter.error_class == "unknown-task"
        assert task_of[header(record, "correlation-id") or ""] in (None, "translate")
        reasons[letter.reason] += 1
    assert reasons == {
        "task 'translate' is none of classify, score": 50,
        "no 'task' header; tasks: classify, score": 50,
    }
    assert per_route == {"classify": 50.0, "score": 50.0}
