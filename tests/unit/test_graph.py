"""Ensemble graphs: wiring by tensor names, joins where branches meet, validation errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.topology.graph import GraphError, StepSpec, compile_graph
from pipeline.topology.loader import load_topology, parse_topology

REPO = Path(__file__).resolve().parents[2]


def _compile(steps: list[StepSpec], inputs: list[str], outputs: list[str]):  # type: ignore[no-untyped-def]
    return compile_graph(
        topology="t", steps=steps, inputs=inputs, outputs=outputs, input_topic="t.in", result_topic="t.out"
    )


def test_fan_out_and_result_join() -> None:
    graph = _compile(
        [
            StepSpec("prep", {"raw": "raw"}, {"features": "features"}),
            StepSpec("a", {"x": "features"}, {"y": "logits"}),
            StepSpec("b", {"x": "features"}, {"y": "score"}),
        ],
        ["raw"],
        ["logits", "score"],
    )
    assert graph.steps["prep"].input_topic == "t.in"
    assert graph.steps["a"].input_topic == graph.steps["b"].input_topic == "t.prep.out"  # fan-out
    [join] = graph.joins.values()
    assert join.branches == ("a", "b") and join.feeds == "result" and join.output_topic == "t.out"
    assert join.input_topics == ("t.a.out", "t.b.out")


def test_a_chain_needs_no_join_because_messages_carry_upstream_tensors() -> None:
    # c needs raw (input), f (from a) and g (from b, which follows a): b's messages carry f.
    graph = _compile(
        [
            StepSpec("a", {"i": "raw"}, {"o": "f"}),
            StepSpec("b", {"i": "f"}, {"o": "g"}),
            StepSpec("c", {"i": "raw", "j": "f", "k": "g"}, {"o": "h"}),
        ],
        ["raw"],
        ["h"],
    )
    assert graph.joins == {}
    assert graph.steps["c"].input_topic == "t.b.out"
    assert graph.steps["c"].output_topic == "t.out" and graph.steps["c"].to_result


def test_diamond_joins_before_the_step_that_needs_both_branches() -> None:
    graph = _compile(
        [
            StepSpec("a", {"i": "raw"}, {"o": "f"}),
            StepSpec("b", {"i": "f"}, {"o": "g"}, join_mode="outer", join_window_ms=100),
            StepSpec("c", {"i": "f"}, {"o": "h"}),
            StepSpec("d", {"i": "g", "j": "h"}, {"o": "z"}, join_mode="any", join_window_ms=250),
        ],
        ["raw"],
        ["z"],
    )
    join = graph.joins["join-d"]
    assert join.branches == ("b", "c") and join.mode == "any" and join.window_ms == 250
    assert graph.steps["d"].input_topic == join.output_topic
    assert graph.order.index("a") < graph.order.index("b") < graph.order.index("d")


def test_cycle_is_rejected_with_its_path() -> None:
    with pytest.raises(GraphError) as error:
        _compile(
            [
                StepSpec("a", {"i": "raw", "j": "z"}, {"o": "x"}),
                StepSpec("b", {"i": "x"}, {"o": "y"}),
                StepSpec("c", {"i": "y"}, {"o": "z"}),
            ],
            ["raw"],
            ["z"],
        )
    message = str(error.value)
    assert "cycle" in message
    assert "a -> b -> c -> a" in message or "b -> c -> a -> b" in message or "c -> a -> b -> c" in message


def test_tensor_consumed_but_never_produced_names_the_step() -> None:
    with pytest.raises(GraphError, match="step 'b' consumes tensor 'ghost', which no step produces"):
        _compile([StepSpec("a", {"i": "raw"}, {"o": "x"}), StepSpec("b", {"i": "ghost"}, {"o": "y"})], ["raw"], ["y"])


def test_tensor_produced_twice_names_both_steps() -> None:
    with pytest.raises(GraphError, match="tensor 'x' is produced twice: by step 'a' and by step 'b'"):
        _compile([StepSpec("a", {"i": "raw"}, {"o": "x"}), StepSpec("b", {"i": "raw"}, {"o": "x"})], ["raw"], ["x"])


def test_output_nobody_produces() -> None:
    with pytest.raises(GraphError, match="output 'nope'"):
        _compile([StepSpec("a", {"i": "raw"}, {"o": "x"})], ["raw"], ["nope"])


GRAPH_YAML = """\
name: g
input_topic: g.in
result_topic: g.out
inputs: [raw]
outputs: [y]
stages:
  - name: a
    kind: stateless
    model: m
    input_map: {i: raw}
    output_map: {o: x}
  - name: b
    kind: stateless
    model: m
    input_map: {i: x, j: y}
    output_map: {o: y}
"""


def test_topology_file_with_a_cycle_is_a_one_line_error_at_the_step() -> None:
    with pytest.raises(ConfigError) as error:
        parse_topology(GRAPH_YAML, "g.yaml")
    message = str(error.value)
    assert message.startswith("g.yaml:")
    assert "stages[1]" in message and "cycle: b -> b" in message
    assert "\n" not in message


def test_topology_file_with_a_dangling_tensor() -> None:
    text = GRAPH_YAML.replace("input_map: {i: x, j: y}", "input_map: {i: x, j: missing}")
    with pytest.raises(ConfigError, match=r"stages\[1\]\.input_map: .*'missing'"):
        parse_topology(text, "g.yaml")


def test_the_ensemble_example_compiles() -> None:
    topology = load_topology(REPO / "topologies" / "ensemble.yaml")
    graph = topology.graph()
    assert list(graph.joins) == ["join-result"]
    assert set(topology.topics()) >= {"ensemble.requests", "ensemble.results", "ensemble.normalise.out"}
    assert "ensemble.join-result.state" in topology.state_topics()
