"""Routes, tasks and shadow of a stateless stage: the topology rules (file:line messages),
the compatibility checks, the sticky weighted choice and the task choice (pure logic)."""

from __future__ import annotations

import math
import uuid
from collections import Counter
from pathlib import Path

import pytest

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.errors import ConfigError
from pipeline.topology import load_topology, parse_topology
from pipeline.topology.compat import check_compatibility
from pipeline.topology.model import StatelessStageConfig
from tests.helpers.fake_triton import FakeModel, FakeTensor, FakeTriton
from workers.stateless.routes import Route, RouteTable, stable_point

REPO = Path(__file__).resolve().parents[2]

HEAD = """\
name: demo
input_topic: requests
result_topic: results
stages:
  - name: score
    kind: stateless
"""

WEIGHTED = HEAD + """\
    routes:
      - {name: stable, model: dense_classifier, weight: 90}
      - {name: canary, model: dense_v2, weight: 10}
"""


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_topology(text, "t.yaml")
    message = str(caught.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- the topology


def test_canary_example_loads() -> None:
    topology = load_topology(REPO / "topologies" / "canary.yaml", environ={})
    [stage] = topology.stages
    assert isinstance(stage, StatelessStageConfig) and stage.routes is not None
    assert [(r.name, r.model, r.weight) for r in stage.routes] == [
        ("stable", "dense_classifier", 90),
        ("canary", "anomaly_score", 10),
    ]
    assert topology.shadow_topic("score") == "canary.results.shadow"
    assert "canary.results.shadow" in topology.topics()  # created with the others


def test_a_stage_without_routes_is_unchanged() -> None:
    topology = parse_topology(HEAD + "    model: dense_classifier\n")
    [stage] = topology.stages
    assert isinstance(stage, StatelessStageConfig)
    assert (stage.model, stage.routes, stage.shadow) == ("dense_classifier", None, None)
    assert topology.topics() == ["requests", "results", "demo.dead-letters", "pipeline.metrics"]


def test_shadow_topic_default_and_explicit() -> None:
    shadowed = HEAD + "    model: dense_classifier\n    shadow: {model: dense_v2}\n"
    assert parse_topology(shadowed).shadow_topic("score") == "results.shadow"
    named = shadowed.replace("{model: dense_v2}", "{model: dense_v2, topic: mirror}")
    assert parse_topology(named).shadow_topic("score") == "mirror"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            WEIGHTED.replace("weight: 90", "weight: -1"),
            "t.yaml:8: stages[0].routes[0].weight: Input should be greater than or equal to 0",
        ),
        (
            WEIGHTED.replace("weight: 90", "weight: 0").replace("weight: 10", "weight: 0"),
            "t.yaml:7: stages[0].routes: every route's weight is 0: no route could serve a record",
        ),
        (
            WEIGHTED.replace("name: canary", "name: stable"),
            "t.yaml:9: stages[0].routes[1].name: duplicate route name 'stable' (also routes[0])",
        ),
        (
            WEIGHTED.replace("model: dense_v2", "model: dense_classifier"),
            "t.yaml:9: stages[0].routes[1].model: routes[0] already serves model 'dense_classifier'",
        ),
        (
            WEIGHTED + "    model: dense_classifier\n",
            "t.yaml:10: stages[0].model: give either model or routes, not both (each route names its model)",
        ),
        (
            HEAD + "    batching: {max_inflight_batches: 2}\n",
            "t.yaml:5: stages[0].model: missing required key (give the stage's model, or its routes)",
        ),
        (
            WEIGHTED.replace("    routes:", "    route_by: task\n    routes:"),
            "t.yaml:9: stages[0].routes[0].weight: with route_by: task the task header chooses the route; "
            "weights would mean nothing, remove it",
        ),
        (
            WEIGHTED.replace(", weight: 10", ""),
            "t.yaml:9: stages[0].routes[1]: route_by: key needs a weight on every route",
        ),
        (
            HEAD + "    model: dense_classifier\n    route_by: task\n",
            "t.yaml:8: stages[0].route_by: route_by: task chooses among routes; this stage has none",
        ),
        (
            HEAD + "    model: dense_classifier\n    shadow: {model: dense_v2, topic: results}\n",
            "t.yaml:8: stages[0].shadow: shadow topic 'results' is also a topic of this topology",
        ),
    ],
    ids=[
        "negative-weight", "all-zero", "duplicate-name", "duplicate-model", "routes-and-model", "neither",
        "task-with-weights", "key-without-weight", "task-without-routes", "shadow-topic-clash",
    ],
)
def test_rules_are_located(text: str, expected: str) -> None:
    assert error_of(text) == expected


def test_graph_steps_take_no_routes() -> None:
    text = """\
name: g
input_topic: in
result_topic: out
inputs: [raw]
outputs: [logits]
stages:
  - name: classify
    kind: stateless
    input_map: {features: raw}
    output_map: {logits: logits}
    routes:
      - {name: a, model: dense_classifier, weight: 1}
"""
    assert error_of(text) == (
        "t.yaml:11: stages[0].routes: graph steps serve one model; routes and shadow are for chains"
    )


# --------------------------------------------------------------------------- compatibility

DENSE = FakeModel([FakeTensor("features", "FP32", (16,))], [FakeTensor("logits", "FP32", (4,))])


def test_every_route_and_the_shadow_are_checked_against_triton() -> None:
    text = WEIGHTED + "    shadow: {model: dense_shadow}\n"
    triton = FakeTriton({"dense_classifier": DENSE})
    assert check_compatibility(parse_topology(text), triton.describe) == [
        "stage 'score': model 'dense_v2' unavailable: Triton has no model 'dense_v2'",
        "stage 'score': model 'dense_shadow' unavailable: Triton has no model 'dense_shadow'",
    ]
    everything = FakeTriton({"dense_classifier": DENSE, "dense_v2": DENSE, "dense_shadow": DENSE})
    assert check_compatibility(parse_topology(text), everything.describe) == []


# --------------------------------------------------------------------------- choosing a route

ROUTES = [Route("stable", "m1", weight=90), Route("canary", "m2", weight=10)]


def test_weights_hold_within_a_binomial_bound() -> None:
    table = RouteTable(ROUTES, by_task=False)
    n = 100_000
    counts = Counter(table.pick(uuid.uuid4().bytes, "", None).name for _ in range(n))
    sigma = math.sqrt(n * 0.1 * 0.9)
    assert abs(counts["canary"] - n * 0.1) < 4 * sigma, counts


def test_a_key_always_gets_the_same_route_and_the_hash_is_not_salted() -> None:
    table = RouteTable(ROUTES, by_task=False)
    for i in range(1000):
        key = f"user-{i}".encode()
        assert len({table.pick(key, f"c{j}", None).name for j in range(5)}) == 1
    # BLAKE2b: a constant, the same in every process (Python's salted hash() differs per process).
    assert stable_point(b"user-1") == 0.6041924073669338


def test_no_key_falls_back_to_the_correlation_id() -> None:
    table = RouteTable(ROUTES, by_task=False)
    assert table.pick(None, "abc", None) == table.pick(b"abc", "other", None)
    assert table.pick(b"", "abc", None) == table.pick(b"abc", "", None)


def test_a_parked_route_gets_nothing() -> None:
    table = RouteTable([Route("a", "m1", weight=0), Route("b", "m2", weight=1), Route("c", "m3", weight=0)], by_task=False)
    assert {table.pick(uuid.uuid4().bytes, "", None).name for _ in range(2000)} == {"b"}


def test_task_header_selects_and_unknown_or_missing_task_is_refused() -> None:
    table = RouteTable([Route("classify", "m1"), Route("score", "m2")], by_task=True)
    assert table.pick(b"k", "c", [("task", b"score")]).model == "m2"
    for headers, reason in (
        ([("task", b"translate")], "task 'translate' is none of classify, score"),
        ([], "no 'task' header; tasks: classify, score"),
    ):
        with pytest.raises(BadRequest) as caught:
            table.pick(b"k", "c", headers)
        assert caught.value.error_class is ErrorClass.UNKNOWN_TASK
        assert caught.value.reason == reason
