"""A stateless stage runs only the features its topology asks for (workers/stateless/features.py).

The stages are built by the runtime's own builder from the shipped topologies (building
connects to nothing). ``topologies/dense.yaml`` asks for none: its stage holds no step and
the bare intake; each featured topology gets exactly its steps. Then the bare stage serves
records through the in-memory harness with every feature's per-record code made to fail
if called: none of it runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.observability.metrics import PipelineMetrics
from pipeline.runtime.stages import build_stages
from pipeline.settings import Endpoints
from pipeline.topology import load_topology
from tests.helpers.stage_harness import ScriptedBackend, feature_requests, stage_harness
from workers.runtime.stream_stage import StreamStage
from workers.stateless.features import (
    NO_FEATURES,
    ApplyDefaults,
    AssignRoute,
    MirrorToShadow,
    NameTenant,
    PadToBucket,
    RenameInputs,
    TrimPadding,
)
from workers.stateless.intake import BareIntake, SteppedIntake
from workers.stateless.stage import BatchingSettings, BatchingStage
from workers.stateless.tenancy.stage import TenantBatchingStage

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def _stages(name: str) -> dict[str, StreamStage]:
    topology = load_topology(TOPOLOGIES / name)
    return {stage.io.stage: stage for stage in build_stages(topology, Endpoints(), PipelineMetrics())}


def _kinds(stage: StreamStage) -> tuple[list[type], list[type], list[type]]:
    assert isinstance(stage, BatchingStage)
    f = stage.features
    return [type(s) for s in f.requests], [type(s) for s in f.results], [type(s) for s in f.observers]


def test_the_dense_stage_holds_no_feature_step() -> None:
    [stage] = _stages("dense.yaml").values()
    assert type(stage) is BatchingStage  # not the tenant-gated stage
    assert stage.features == NO_FEATURES and not stage.features
    assert isinstance(stage.intake, BareIntake)


@pytest.mark.parametrize(
    ("topology", "stage", "requests", "results", "observers", "gated"),
    [
        ("padded.yaml", None, [PadToBucket], [TrimPadding], [], False),
        ("canary.yaml", "score", [AssignRoute], [], [MirrorToShadow], False),
        ("tasks.yaml", None, [AssignRoute], [], [], False),
        ("lanes.yaml", None, [ApplyDefaults], [], [], False),
        ("tenants.yaml", None, [], [], [], True),  # the gate is the class; NameTenant only with fair_share
        ("chain.yaml", None, [RenameInputs], [], [], False),
    ],
)
def test_each_featured_topology_gets_exactly_its_steps(
    topology: str, stage: str | None, requests: list[type], results: list[type], observers: list[type], gated: bool
) -> None:
    stages = _stages(topology)
    built = stages[stage] if stage is not None else next(iter(stages.values()))
    assert _kinds(built) == (requests, results, observers)
    assert isinstance(built, TenantBatchingStage) is gated
    assert isinstance(built, BatchingStage) and isinstance(built.intake, SteppedIntake) is bool(requests)


def test_the_dali_stage_of_the_audio_topology_holds_no_feature_step() -> None:
    stage = _stages("audio.yaml")["preprocess"]
    assert isinstance(stage, BatchingStage) and stage.features == NO_FEATURES


async def test_a_bare_stage_calls_no_features_code_per_record(monkeypatch: pytest.MonkeyPatch) -> None:
    def called(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a feature's code ran on the bare path")

    for target in (
        "workers.stateless.tensor_map.TensorMap.to_model",
        "workers.stateless.padding.Padder.pad",
        "workers.stateless.padding.Padder.trim",
        "workers.stateless.shadow.ShadowMirror.offer",
        "workers.stateless.tenancy.gate.TenantGate.admit",
        "workers.stateless.features.lane_priority",
        "workers.stateless.features.ApplyDefaults.applied",
    ):
        monkeypatch.setattr(target, called)
    backend = ScriptedBackend()
    async with stage_harness(backend, BatchingSettings(max_batch_size=8, max_queue_delay_s=0.001)) as harness:
        assert harness.stage.features == NO_FEATURES
        await harness.feed(feature_requests(20))
        await harness.pump()
        assert [r.correlation_id for r in harness.results()] == [f"c{i}" for i in range(20)]
        assert harness.dead_letters() == [] and harness.committed() == 20


def test_fair_share_adds_the_tenant_step_and_the_fair_batcher(tmp_path: Path) -> None:
    text = (TOPOLOGIES / "tenants.yaml").read_text()
    assert "fair_share: false" in text
    (tmp_path / "fair.yaml").write_text(text.replace("fair_share: false", "fair_share: true"))
    [stage] = build_stages(load_topology(tmp_path / "fair.yaml"), Endpoints(), PipelineMetrics())
    assert isinstance(stage, TenantBatchingStage)
    assert _kinds(stage) == ([NameTenant], [], [])
