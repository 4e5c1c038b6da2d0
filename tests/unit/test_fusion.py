"""Fused chains: the ``fuse:`` rules (file:line errors), the fused graph, the generated ensemble."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from pipeline.errors import ConfigError
from pipeline.modelstore.ensemble import (
    DIGEST_PARAMETER,
    STEPS_PARAMETER,
    VERSION_MARKER,
    EnsembleMember,
    generate_ensemble,
)
from pipeline.topology.compat import check_compatibility
from pipeline.topology.fusion import fusable_problems
from pipeline.topology.loader import load_topology, parse_topology
from pipeline.topology.model import StatelessStageConfig
from pipeline.triton.admin import ModelDescription, SequenceBatching, TensorSpec

REPO = Path(__file__).resolve().parents[2]

HEAD = """\
name: t
input_topic: t.in
result_topic: t.out
inputs: [raw]
outputs: [{outputs}]
"""


def _step(name: str, model: str, ins: str, outs: str) -> str:
    return f"""\
  - name: {name}
    kind: stateless
    model: {model}
    input_map: {{{ins}}}
    output_map: {{{outs}}}
"""


CHAIN3 = (
    HEAD.format(outputs="y")
    + "stages:\n"
    + _step("a", "ma", "i: raw", "o: f")
    + _step("b", "mb", "i: f", "o: g")
    + _step("c", "mc", "i: g", "o: y")
)


def _fused(text: str, steps: str) -> str:
    return text + f"fuse:\n  - steps: [{steps}]\n"


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as error:
        parse_topology(text, "f.yaml")
    return str(error.value)


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line and not line.startswith("#"))


# --------------------------------------------------------------------------- the rules


def test_the_chain_example_fuses_into_one_stage_without_an_intermediate_topic() -> None:
    topology = load_topology(REPO / "topologies" / "chain.yaml")
    graph = topology.graph()
    assert graph.order == ["normalise--classify"] and graph.joins == {}
    node = graph.steps["normalise--classify"]
    assert (node.input_topic, node.output_topic, node.to_result) == ("chain.requests", "chain.results", True)
    assert "chain.normalise.out" not in topology.topics()
    assert topology.group_id("normalise--classify") == "chain.normalise--classify"
    stage = topology.stage("normalise--classify")
    assert isinstance(stage, StatelessStageConfig)
    assert stage.model == "chain--normalise--classify" and stage.model_version == ""
    assert (stage.input_map, stage.output_map) == ({"raw": "raw"}, {"logits": "logits"})
    assert stage.batching == topology.stage("normalise").batching  # the first step's settings


def test_without_fuse_the_graph_is_unchanged() -> None:
    topology = load_topology(REPO / "topologies" / "ensemble.yaml")
    assert topology.fuse == [] and topology.graph() == topology.graph(fused=False)
    plain = parse_topology(CHAIN3, "f.yaml")
    assert plain.graph().order == ["a", "b", "c"] and "t.a.out" in plain.topics()


def test_a_fused_middle_keeps_the_hops_around_it() -> None:
    topology = parse_topology(_fused(CHAIN3, "b, c"), "f.yaml")
    graph = topology.graph()
    assert graph.order == ["a", "b--c"]
    assert graph.steps["b--c"].input_topic == "t.a.out" and graph.steps["b--c"].to_result


def test_an_intermediate_tensor_needed_outside_the_chain_is_an_ensemble_output() -> None:
    text = (
        HEAD.format(outputs="y, f")
        + "stages:\n"
        + _step("a", "ma", "i: raw", "o: f")
        + _step("b", "mb", "i: f", "o: y")
    )
    stage = parse_topology(_fused(text, "a, b"), "f.yaml").stage("a--b")
    assert isinstance(stage, StatelessStageConfig)
    assert stage.output_map == {"f": "f", "y": "y"}


@pytest.mark.parametrize(
    ("steps", "where", "message"),
    [
        ("a, ghost", "ghost", "fuse: no stage named 'ghost'"),
        ("a, a", "[a, a]", "step 'a' is fused twice (earlier in this chain)"),
        ("a, c", "[a, c]", "step 'c' reads step 'b' (b is outside the fused set): only the entry step 'a'"),
        ("b, a", "[b, a]", "step 'b' is listed first but reads step 'a', inside the fused set"),
        ("b, c, a", "[b, c, a]", "step 'b' is listed first but reads step 'a', inside the fused set"),
    ],
)
def test_a_broken_chain_is_a_located_error(steps: str, where: str, message: str) -> None:
    text = _fused(CHAIN3, steps)
    error = _error(text)
    assert error.startswith(f"f.yaml:{_line_of(text, 'fuse:') + 1}: fuse[0].steps["), error
    assert message in error


ENSEMBLE = (REPO / "topologies" / "ensemble.yaml").read_text()


def test_a_fan_out_and_its_inner_join_fuse_into_one_stage_writing_the_result() -> None:
    topology = parse_topology(_fused(ENSEMBLE, "normalise, classify, score"), "f.yaml")
    graph = topology.graph()
    assert graph.order == ["normalise--score"] and graph.joins == {}  # no join-result stage
    node = graph.steps["normalise--score"]
    assert (node.input_topic, node.output_topic, node.to_result) == ("ensemble.requests", "ensemble.results", True)
    assert not any(topic.endswith(".out") for topic in topology.topics())  # no hop inside, no join topic
    stage = topology.stage("normalise--score")
    assert isinstance(stage, StatelessStageConfig)
    assert stage.model == "ensemble--normalise--score"
    assert (stage.input_map, stage.output_map) == ({"raw": "raw"}, {"logits": "logits", "score": "score"})


def test_fusing_up_to_a_fan_out_hands_the_shared_tensor_to_the_branch_outside() -> None:
    topology = parse_topology(_fused(ENSEMBLE, "normalise, classify"), "f.yaml")
    graph = topology.graph()
    assert graph.order == ["normalise--classify", "score"] and graph.joins == {}
    assert graph.steps["score"].input_topic == "ensemble.normalise--classify.out"
    assert graph.steps["score"].to_result  # its messages carry logits from upstream, as in any graph
    stage = topology.stage("normalise--classify")
    assert isinstance(stage, StatelessStageConfig)
    assert stage.output_map == {"features": "features", "logits": "logits"}  # score still reads features


DIAMOND = (
    HEAD.format(outputs="z")
    + "stages:\n"
    + _step("a", "ma", "i: raw", "o: f")
    + _step("b", "mb", "i: f", "o: g")
    + _step("c", "mc", "i: f", "o: h")
    + _step("d", "md", "i: g, j: h", "o: z")
    + "    join: {mode: outer}\n"
)


def test_a_join_inside_the_set_fuses_only_when_inner() -> None:
    error = _error(_fused(DIAMOND, "a, b, c, d"))
    assert f"f.yaml:{_line_of(_fused(DIAMOND, 'a, b, c, d'), '- steps:')}: fuse[0].steps[3]:" in error
    assert "the outer join of b, c in front of step 'd' would be inside the fused set: only an inner join" in error
    inner = parse_topology(_fused(DIAMOND.replace("mode: outer", "mode: inner"), "a, b, c, d"), "f.yaml")
    assert inner.graph().order == ["a--d"] and inner.graph().joins == {}
    assert inner.stage("a--d").output_map == {"z": "z"}


def test_an_outer_result_join_of_two_fused_branches_is_refused() -> None:
    text = _fused(ENSEMBLE.replace("mode: inner", "mode: outer"), "normalise, classify, score")
    error = _error(text)
    assert (
        f"f.yaml:{_line_of(text, '- steps:')}: fuse[0]: the outer join of classify, score in front of the result"
        in error
    )
    # One branch inside, the other downstream of the set: d would read c's messages only.
    mixed = _error(_fused(DIAMOND, "a, b"))
    assert "fuse[0]: the outer join of b, c in front of step 'd' would lose its branch 'b' (c also reads" in mixed
    inner = parse_topology(_fused(DIAMOND.replace("mode: outer", "mode: inner"), "a, b"), "f.yaml").graph()
    assert inner.joins == {} and inner.steps["d"].upstream == ("c",)  # c's messages carry g
    # One branch inside, one independent of the set: the outer join stays, the fused stage a branch.
    side = DIAMOND.replace("input_map: {i: f}\n    output_map: {o: h}", "input_map: {i: raw}\n    output_map: {o: h}")
    kept = parse_topology(_fused(side, "a, b"), "f.yaml").graph()
    assert kept.joins["join-d"].branches == ("a--b", "c") and kept.joins["join-d"].mode == "outer"


def test_a_step_behind_a_join_cannot_be_fused_with_a_branch() -> None:
    text = (
        HEAD.format(outputs="z")
        + "stages:\n"
        + _step("a", "ma", "i: raw", "o: f")
        + _step("b", "mb", "i: raw", "o: g")
        + _step("c", "mc", "i: f, j: g", "o: z")
    )
    error = _error(_fused(text, "b, c"))
    assert "fuse[0].steps[1]: step 'c' reads a join of a, b (a is outside the fused set)" in error
    two_entries = _error(_fused(text, "a, b, c"))
    assert (
        "fuse[0].steps[1]: step 'b' reads the request topic (the request topic is outside the fused set)" in two_entries
    )


def test_dali_and_sequence_steps_and_chain_topologies_are_refused() -> None:
    text = """\
name: t
input_topic: t.in
result_topic: t.out
stages:
  - {name: pre, kind: dali}
  - {name: vad, kind: sequence, model: silero_vad}
  - {name: post, kind: stateless, model: dense_classifier}
"""
    dali = _error(text + "fuse:\n  - steps: [pre, vad]\n")
    assert "f.yaml:9: fuse[0].steps[0]: step 'pre' is a dali stage: only stateless Triton steps fuse" in dali
    sequence = _error(text + "fuse:\n  - steps: [post, vad]\n")
    assert "fuse[0].steps[1]: step 'vad' is a sequence stage" in sequence
    chain = _error(
        text.replace(
            "  - {name: pre, kind: dali}\n  - {name: vad, kind: sequence, model: silero_vad}\n",
            "  - {name: first, kind: stateless, model: m}\n",
        )
        + "fuse:\n  - steps: [first, post]\n"
    )
    assert "fuse applies to graph topologies" in chain


def test_a_chain_of_one_step_is_refused() -> None:
    assert "fuse[0].steps" in _error(_fused(CHAIN3, "a"))


# --------------------------------------------------------------------------- live checks


def _description(name: str, ins: dict[str, list[int]], outs: dict[str, list[int]], **kw: object) -> ModelDescription:
    def specs(tensors: dict[str, list[int]], dtype: str = "FP32") -> list[TensorSpec]:
        return [TensorSpec(n, dtype, s, [-1, *s]) for n, s in tensors.items()]

    defaults: dict[str, object] = {"versions": [1], "platform": "", "backend": "python", "max_batch_size": 64}
    defaults.update(kw)
    return ModelDescription(name=name, inputs=specs(ins), outputs=specs(outs), **defaults)  # type: ignore[arg-type]


def test_members_triton_cannot_ensemble_are_named() -> None:
    assert fusable_problems("s", "m", max_batch_size=64, sequence=False, decoupled=False) == []
    problems = fusable_problems("s", "m", max_batch_size=0, sequence=True, decoupled=True)
    assert len(problems) == 3 and "max_batch_size > 0" in problems[0]


def test_validate_reports_a_sequence_member() -> None:
    topology = parse_topology(_fused(CHAIN3, "a, b"), "f.yaml")
    models = {
        "ma": _description("ma", {"i": [4]}, {"o": [4]}),
        "mb": _description(
            "mb", {"i": [4]}, {"o": [4]}, sequence_batching=SequenceBatching("oldest", 0, 0, [], 0, [], [])
        ),
        "mc": _description("mc", {"i": [4]}, {"o": [2]}, max_batch_size=0),
    }
    problems = check_compatibility(topology, lambda model, _version: models[model])
    assert problems == ["fused step 'b': model 'mb' is a sequence model; it cannot be fused"]


# --------------------------------------------------------------------------- the generated ensemble


def _members(version_b: str = "") -> list[EnsembleMember]:
    a = _description("ma", {"raw_in": [16]}, {"feat": [16], "unused": [1]}, max_batch_size=64)
    b = _description("mb", {"x": [16]}, {"logits": [4]}, max_batch_size=32)
    return [
        EnsembleMember("a", "ma", "", {"raw_in": "raw"}, {"feat": "features"}, a),
        EnsembleMember("b", "mb", version_b, {"x": "features"}, {"logits": "logits"}, b),
    ]


def test_the_generated_config_is_a_triton_ensemble_following_the_maps() -> None:
    generated = generate_ensemble("t--a--b", _members("2"), ["raw"], ["logits"], topology="t")
    config = text_format.Parse(generated.config_text, model_config_pb2.ModelConfig())
    assert (config.name, config.platform, config.max_batch_size) == ("t--a--b", "ensemble", 32)
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("raw", model_config_pb2.TYPE_FP32, [16])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("logits", [4])]
    first, second = config.ensemble_scheduling.step
    assert (first.model_name, first.model_version, dict(first.input_map), dict(first.output_map)) == (
        "ma",
        -1,
        {"raw_in": "raw"},
        {"feat": "features"},
    )
    assert (second.model_name, second.model_version, dict(second.input_map)) == ("mb", 2, {"x": "features"})
    assert config.parameters[STEPS_PARAMETER].string_value == "a,b"
    assert config.parameters[DIGEST_PARAMETER].string_value == generated.digest
    assert set(generated.files()) == {"config.pbtxt", VERSION_MARKER}  # Triton needs the version folder


def test_the_digest_follows_the_content() -> None:
    one = generate_ensemble("e", _members(), ["raw"], ["logits"], topology="t")
    assert one == generate_ensemble("e", _members(), ["raw"], ["logits"], topology="t")
    assert one.digest != generate_ensemble("e", _members("2"), ["raw"], ["logits"], topology="t").digest
    assert one.digest != generate_ensemble("e", _members(), ["raw"], ["logits", "features"], topology="t").digest


def test_a_fan_out_ensemble_shares_a_tensor_and_its_names_are_checked() -> None:
    norm = _description("mn", {"raw_in": [16]}, {"feat": [16]})
    members = [
        EnsembleMember("n", "mn", "", {"raw_in": "raw"}, {"feat": "features"}, norm),
        EnsembleMember("c", "mc", "", {"x": "features"}, {"y": "logits"}, _description("mc", {"x": [16]}, {"y": [4]})),
        EnsembleMember("s", "ms", "", {"x": "features"}, {"y": "score"}, _description("ms", {"x": [16]}, {"y": [1]})),
    ]
    config = text_format.Parse(
        generate_ensemble("e", members, ["raw"], ["logits", "score"], topology="t").config_text,
        model_config_pb2.ModelConfig(),
    )
    assert [dict(step.input_map) for step in config.ensemble_scheduling.step] == [
        {"raw_in": "raw"},
        {"x": "features"},
        {"x": "features"},
    ]
    twice = [*members[:2], EnsembleMember("s", "ms", "", {"x": "features"}, {"y": "logits"}, members[2].description)]
    with pytest.raises(ConfigError, match="ensemble tensor 'logits' is written twice: by fused step 'c' and by fused"):
        generate_ensemble("e", twice, ["raw"], ["logits"], topology="t")
    with pytest.raises(ConfigError, match="fused step 'c' reads 'features', which neither the ensemble's inputs"):
        generate_ensemble("e", members[1:], ["raw"], ["logits"], topology="t")


def test_the_commented_fuse_of_the_ensemble_example_is_valid() -> None:
    uncommented = ENSEMBLE.replace("# fuse:\n#   - steps:", "fuse:\n  - steps:")
    assert uncommented != ENSEMBLE
    assert parse_topology(uncommented, "ensemble.yaml").graph().order == ["normalise--score"]
