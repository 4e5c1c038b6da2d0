"""Topology files: loading, interpolation, located errors, topic chain, model compatibility."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.errors import ConfigError, EndpointUnreachable
from pipeline.topology import load_topology, parse_topology
from pipeline.topology.compat import check_compatibility
from pipeline.topology.model import DaliStageConfig, StageTopics, StatelessStageConfig, Topology
from pipeline.topology.schema import render_schema
from tests.helpers.fake_triton import FakeModel, FakeTensor, FakeTriton

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "topologies" / "dense.yaml"
SCHEMA_FILE = REPO_ROOT / "topologies" / "topology.schema.json"

ONE_STAGE = """\
name: demo
input_topic: requests
result_topic: results
stages:
  - name: classify
    kind: stateless
    model: dense_classifier
"""


def write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(path: Path, environ: dict[str, str] | None = None) -> str:
    """The message of the ConfigError that loading ``path`` raises; it must be one line."""
    with pytest.raises(ConfigError) as caught:
        load_topology(path, environ={} if environ is None else environ)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- the example


def test_example_loads_with_defaults() -> None:
    topology = load_topology(EXAMPLE, environ={})
    assert topology.name == "dense-demo"
    assert topology.kafka.bootstrap_servers is None  # ${KAFKA_BOOTSTRAP:-} unset -> null
    assert topology.kafka.partitions == 4
    assert topology.triton.grpc_url is None
    [stage] = topology.stages
    assert isinstance(stage, StatelessStageConfig)
    assert (stage.model, stage.model_version) == ("dense_classifier", "")
    assert stage.batching.max_batch_size is None
    assert stage.retry.max_attempts == 5
    assert topology.stage_topics() == [StageTopics("dense.requests", "dense.results")]
    assert topology.group_id("classify") == "dense-demo.classify"
    assert topology.topics() == [
        "dense.requests",
        "dense.results",
        "dense.dead-letters",
        "pipeline.metrics",
    ]


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "PIPELINE_KAFKA_SASL_PASSWORD", "API_TOKEN"])
def test_a_topology_cannot_read_a_credential_from_the_environment(tmp_path: Path, name: str) -> None:
    """A credential read into a topic name would be created, logged and printed: refused, set or not."""
    path = tmp_path / "t.yaml"
    path.write_text(ONE_STAGE.replace("input_topic: requests", "input_topic: ${" + name + ":-x}"))
    with pytest.raises(ConfigError, match=f":2: input_topic: environment variable {name} looks like a credential"):
        load_topology(path, environ={name: "s3cr3t-value"})


def test_example_takes_endpoints_from_environment() -> None:
    topology = load_topology(EXAMPLE, environ={"KAFKA_BOOTSTRAP": "k:9092", "TRITON_URL": "t:8001"})
    assert topology.kafka.bootstrap_servers == "k:9092"
    assert topology.triton.grpc_url == "t:8001"


def test_example_declares_its_schema() -> None:
    first_line = EXAMPLE.read_text().splitlines()[0]
    assert first_line == "# yaml-language-server: $schema=./topology.schema.json"


def test_committed_schema_is_current() -> None:
    assert SCHEMA_FILE.read_text() == render_schema(), (
        "regenerate: pipeline validate --schema > topologies/topology.schema.json"
    )


# --------------------------------------------------------------------------- interpolation


def test_interpolation_set_variable(tmp_path: Path) -> None:
    path = write(tmp_path, ONE_STAGE.replace("requests", "${IN}"))
    assert load_topology(path, environ={"IN": "from-env"}).input_topic == "from-env"


def test_interpolation_default_when_unset_or_empty(tmp_path: Path) -> None:
    path = write(tmp_path, ONE_STAGE.replace("requests", "${IN:-fallback}"))
    assert load_topology(path, environ={}).input_topic == "fallback"
    assert load_topology(path, environ={"IN": ""}).input_topic == "fallback"


def test_interpolated_plain_scalar_is_typed_like_yaml(tmp_path: Path) -> None:
    text = ONE_STAGE + "    batching:\n      max_batch_size: ${MBS:-8}\n"
    path = write(tmp_path, text)
    assert load_topology(path, environ={"MBS": "32"}).stages[0].batching.max_batch_size == 32
    quoted = write(tmp_path, text.replace("${MBS:-8}", '"${MBS:-8}"'), "quoted.yaml")
    assert "Input should be a valid integer" in config_error(quoted)


def test_interpolation_escape(tmp_path: Path) -> None:
    path = write(tmp_path, ONE_STAGE + "    input_map:\n      features: $${X}\n")
    assert load_topology(path, environ={}).stages[0].input_map == {"features": "${X}"}


def test_interpolation_missing_variable_names_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, ONE_STAGE + "    model_version: ${VERSION}\n")
    message = config_error(path)
    assert message.startswith(f"{path}:8: stages[0].model_version: ")
    assert "VERSION is not set" in message


def test_interpolation_malformed_reference(tmp_path: Path) -> None:
    path = write(tmp_path, ONE_STAGE.replace("requests", "${not valid}"))
    assert config_error(path).startswith(f"{path}:2: input_topic: malformed variable reference")


# --------------------------------------------------------------------------- located errors


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            ONE_STAGE + "    modle: x\n", ":8: stages[0].modle: unknown key", id="unknown-key"
        ),
        pytest.param(
            ONE_STAGE + "    batching:\n      max_queue_delay_ms: soon\n",
            ":9: stages[0].batching.max_queue_delay_ms: Input should be a valid number",
            id="wrong-type",
        ),
        pytest.param(
            ONE_STAGE + "    batching:\n      max_batch_size: '8'\n",
            ":9: stages[0].batching.max_batch_size: Input should be a valid integer",
            id="no-string-coercion",
        ),
        pytest.param(
            ONE_STAGE + "    model: other\n",
            ":8: stages[0].model: duplicate key (first at line 7)",
            id="duplicate-key",
        ),
        pytest.param(
            ONE_STAGE + "    retry: {max_attempts: 3\n", ":9: invalid YAML", id="yaml-syntax"
        ),
        pytest.param(
            ONE_STAGE.replace("    model: dense_classifier\n", ""),
            ":5: stages[0].model: missing required key",
            id="missing-key",
        ),
        pytest.param(
            ONE_STAGE.replace("stateless", "stateful"),
            ":6: stages[0].kind: unknown kind 'stateful'",
            id="unknown-kind",
        ),
        pytest.param(
            "kafka:\n  sasl_password: hunter2\n" + ONE_STAGE,
            ":2: kafka.sasl_password: security options come from the environment only",
            id="secret-in-file",
        ),
        pytest.param(
            ONE_STAGE.replace("name: demo", "name: Demo_1"),
            ":1: name: 'Demo_1' is not a valid name",
            id="invalid-name",
        ),
        pytest.param(
            ONE_STAGE.replace("results", "results!"),
            ":3: result_topic: 'results!' is not a valid Kafka topic name",
            id="invalid-topic",
        ),
        pytest.param("", ":1: the file is empty", id="empty"),
    ],
)
def test_error_names_file_line_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    assert config_error(path).startswith(f"{path}{expected}")


def test_unknown_key_suggests_the_known_one(tmp_path: Path) -> None:
    path = write(tmp_path, ONE_STAGE + "    modle: x\n")
    assert config_error(path).endswith("unknown key (did you mean 'model'?)")


def test_several_errors_report_the_first_and_count(tmp_path: Path) -> None:
    path = write(tmp_path, ONE_STAGE + "    warmup: 3\n    modle: x\n")
    message = config_error(path)
    assert message.startswith(f"{path}:8: stages[0].warmup: ")
    assert message.endswith("(and 1 more)")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    assert config_error(path) == f"{path}: no such file"


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, ONE_STAGE)

    def denied(*_args: object, **_kwargs: object) -> str:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", denied)  # root ignores chmod 000
    assert config_error(path) == f"{path}: cannot read: permission denied"


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    assert config_error(path).startswith(f"{path}: not UTF-8 text")


# --------------------------------------------------------------------------- topic chain


THREE_STAGES = """\
name: audio
input_topic: audio.in
result_topic: audio.out
stages:
  - name: frames
    kind: dali
  - name: vad
    kind: sequence
    model: silero_vad
  - name: classify
    kind: stateless
    model: dense_classifier
"""


def test_three_stage_chain_defaults() -> None:
    topology = parse_topology(THREE_STAGES)
    assert isinstance(topology.stages[0], DaliStageConfig)
    assert topology.stage_topics() == [
        StageTopics("audio.in", "audio.frames.out"),
        StageTopics("audio.frames.out", "audio.vad.out"),
        StageTopics("audio.vad.out", "audio.out"),
    ]
    assert [topology.group_id(s.name) for s in topology.stages] == [
        "audio.frames",
        "audio.vad",
        "audio.classify",
    ]
    assert topology.topics() == [
        "audio.in",
        "audio.frames.out",
        "audio.vad.out",
        "audio.out",
        "audio.dead-letters",
        "pipeline.metrics",
    ]


def test_explicit_topic_on_either_side_of_an_edge() -> None:
    by_input = THREE_STAGES.replace(
        "    model: silero_vad\n", "    model: silero_vad\n    input_topic: pcm\n"
    )
    assert parse_topology(by_input).stage_topics()[0].output == "pcm"
    by_output = THREE_STAGES.replace("    kind: dali\n", "    kind: dali\n    output_topic: pcm\n")
    assert parse_topology(by_output).stage_topics()[1].input == "pcm"


def test_contradicting_topics_are_rejected() -> None:
    both = THREE_STAGES.replace(
        "    kind: dali\n", "    kind: dali\n    output_topic: a\n"
    ).replace("    model: silero_vad\n", "    model: silero_vad\n    input_topic: b\n")
    with pytest.raises(ConfigError, match=r"^t.yaml:7: stages\[0\].output_topic: 'a' differs"):
        parse_topology(both, "t.yaml")


def test_topic_reused_in_chain_is_rejected() -> None:
    loop = THREE_STAGES.replace("    kind: dali\n", "    kind: dali\n    output_topic: audio.in\n")
    with pytest.raises(ConfigError, match="appears twice in the stage chain"):
        parse_topology(loop)


def test_duplicate_stage_names_rejected() -> None:
    text = ONE_STAGE + "  - name: classify\n    kind: dali\n"
    with pytest.raises(ConfigError) as caught:
        parse_topology(text, "t.yaml")
    assert str(caught.value) == (
        "t.yaml:8: stages[1].name: duplicate stage name 'classify' (also stages[0])"
    )


# --------------------------------------------------------------------------- compatibility


DENSE = FakeModel([FakeTensor("features", "FP32", (16,))], [FakeTensor("logits", "FP32", (4,))])

CHAIN = """\
name: chain
input_topic: in
result_topic: out
stages:
  - name: embed
    kind: stateless
    model: embedder
  - name: classify
    kind: stateless
    model: dense_classifier
"""


def problems_of(text: str, **models: FakeModel) -> list[str]:
    """What ``check_compatibility`` reports for topology ``text`` against a Triton holding ``models``."""
    return check_compatibility(parse_topology(text), FakeTriton(models).describe)


def test_compatible_example() -> None:
    triton = FakeTriton({"dense_classifier": DENSE})
    assert check_compatibility(load_topology(EXAMPLE, environ={}), triton.describe) == []


def test_stage_model_missing() -> None:
    problems = check_compatibility(load_topology(EXAMPLE, environ={}), FakeTriton().describe)
    assert problems == [
        (
            "stage 'classify': model 'dense_classifier' unavailable: Triton has no model "
            "'dense_classifier'"
        )
    ]


#: The edge embed -> classify of CHAIN: what ``embedder`` outputs (classify's model, DENSE,
#: takes ``features`` FP32 [16]), what the embed stage adds to its config, the problems found.
CHAIN_EDGES: dict[str, tuple[FakeTensor, str, list[str]]] = {
    "compatible through output_map": (
        FakeTensor("emb", "FP32", (16,)),
        "    output_map: {emb: features}\n",
        [],
    ),
    "dtype mismatch": (
        FakeTensor("features", "FP16", (16,)),
        "",
        ["stage 'classify': input 'features' is FP32 but stage 'embed' produces it as FP16"],
    ),
    "shape mismatch": (
        FakeTensor("features", "FP32", (8,)),
        "",
        ["stage 'classify': input 'features' has shape [16] but stage 'embed' produces [8]"],
    ),
    "variable dims match any": (FakeTensor("features", "FP32", (-1,)), "", []),
    "input not produced": (
        FakeTensor("emb", "FP32", (16,)),
        "",
        ["stage 'classify': input 'features' is not produced by stage 'embed' (it produces: emb)"],
    ),
}


@pytest.mark.parametrize("edge", list(CHAIN_EDGES))
def test_chain_edge(edge: str) -> None:
    output, embed_config, expected = CHAIN_EDGES[edge]
    embedder = FakeModel([FakeTensor("x", "FP32", (-1,))], [output])
    text = CHAIN.replace("model: embedder\n", "model: embedder\n" + embed_config)
    assert problems_of(text, embedder=embedder, dense_classifier=DENSE) == expected


def test_unknown_map_tensor() -> None:
    text = ONE_STAGE + "    input_map: {feature: raw}\n    output_map: {logit: scores}\n"
    assert problems_of(text, dense_classifier=DENSE) == [
        (
            "stage 'classify': input_map key 'feature' is not an input of model "
            "'dense_classifier' (its inputs: features)"
        ),
        (
            "stage 'classify': output_map key 'logit' is not an output of model "
            "'dense_classifier' (its outputs: logits)"
        ),
    ]


def test_batch_size_above_the_model_limit() -> None:
    text = ONE_STAGE + "    batching: {max_batch_size: 128}\n"
    assert problems_of(text, dense_classifier=DENSE) == [
        (
            "stage 'classify': batching.max_batch_size 128 exceeds the max_batch_size 64 of "
            "model 'dense_classifier'"
        )
    ]


# --------------------------------------------------------------------------- the CLI


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "validate", *args],
        cwd=REPO_ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_validate_offline_ok() -> None:
    result = run_cli("--offline", "topologies/dense.yaml")
    assert result.returncode == 0, result.stderr
    assert "dense-demo.classify" in result.stdout
    assert "ok" in result.stdout.splitlines()[-1]


def test_cli_validate_broken_file(tmp_path: Path) -> None:
    path = write(tmp_path, ONE_STAGE + "    modle: x\n")
    result = run_cli("--offline", str(path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: {path}:8: stages[0].modle: unknown key (did you mean 'model'?)"
    ]


def test_cli_prints_schema() -> None:
    result = run_cli("--schema")
    assert result.returncode == 0, result.stderr
    assert result.stdout == render_schema()


def test_optional_inputs_and_in_process_stages_are_not_required() -> None:
    vad = FakeModel(
        [FakeTensor("audio", "FP32", (512,)), FakeTensor("state_in", "FP32", (2, 128), True)],
        [FakeTensor("probability", "FP32", (1,))],
    )
    framer = FakeModel([FakeTensor("pcm", "INT16", (-1,))], [FakeTensor("audio", "FP32", (512,))])
    text = THREE_STAGES.replace("    kind: dali\n", "    kind: stateless\n    model: framer\n")
    models = {"framer": framer, "silero_vad": vad, "dense_classifier": DENSE}
    # framer -> vad: `state_in` is optional. vad -> classify: not produced, reported.
    assert problems_of(text, **models) == [
        (
            "stage 'classify': input 'features' is not produced by stage 'vad' "
            "(it produces: probability)"
        )
    ]
    # With the DALI stage in front, the edge into `vad` is not checked at all.
    assert len(problems_of(THREE_STAGES, **models)) == 1


def test_unreachable_triton_is_not_a_missing_model() -> None:
    def unreachable(name: str, version: str) -> FakeModel:
        raise EndpointUnreachable("cannot reach Triton at t:8001")

    with pytest.raises(EndpointUnreachable):
        check_compatibility(load_topology(EXAMPLE, environ={}), unreachable)


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "topologies").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_topology_loads_and_declares_its_schema(path: Path) -> None:
    """Each file in topologies/ is a working example: it loads offline, without environment."""
    assert path.read_text().splitlines()[0] == "# yaml-language-server: $schema=./topology.schema.json"
    topology = load_topology(path, environ={})
    assert topology.stages


def test_replication_factor_defaults_to_the_brokers() -> None:
    """-1: the broker's default.replication.factor (a managed Kafka with min.insync.replicas=2
    gets topics it can write to); 0 or below -1 is refused."""
    base = {"name": "rf", "input_topic": "in", "result_topic": "out", "stages": [{"name": "s", "kind": "stateless", "model": "m"}]}
    assert Topology.model_validate(base).kafka.replication_factor == -1
    assert Topology.model_validate({**base, "kafka": {"replication_factor": 3}}).kafka.replication_factor == 3
    for wrong in (0, -2):
        with pytest.raises(ValidationError, match="replication_factor must be -1"):
            Topology.model_validate({**base, "kafka": {"replication_factor": wrong}})


def test_topic_configs_go_to_the_broker_as_strings_and_cannot_take_the_pipelines_own() -> None:
    base = {"name": "tc", "input_topic": "in", "result_topic": "out", "stages": [{"name": "s", "kind": "stateless", "model": "m"}]}
    assert Topology.model_validate(base).kafka.topic_settings() == {}
    kafka = {"replication_factor": 3, "topic_configs": {"min.insync.replicas": 2, "retention.ms": "86400000"}}
    settings = Topology.model_validate({**base, "kafka": kafka}).kafka.topic_settings()
    assert settings == {"min.insync.replicas": "2", "retention.ms": "86400000"}
    for owned in ("cleanup.policy", "max.message.bytes"):
        with pytest.raises(ValidationError, match=f"{owned} is set by the pipeline itself"):
            Topology.model_validate({**base, "kafka": {"topic_configs": {owned: "1"}}})
