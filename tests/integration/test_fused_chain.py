"""Fused steps on the real stack: one Triton ensemble stage instead of Kafka hops and joins.

The same chain (feature_norm -> dense_classifier, ``topologies/chain.yaml``) and
the same fan-out + inner join (``topologies/ensemble.yaml``: normalise ->
{classify, score} -> result) run fused and unfused on the same requests; the
results must be the same per correlation ID and equal the numpy references. The generated ensemble must be in the S3 store (Triton's
layout, version folder included) and READY in Triton's repository index, and a
chain Triton cannot run as an ensemble must be refused with the reason.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from pipeline.modelstore.ensemble import DIGEST_PARAMETER, STEPS_PARAMETER
from pipeline.modelstore.store import ModelStore
from pipeline.settings import S3Settings, TritonSettings
from pipeline.triton.admin import TritonAdmin
from tests.helpers import cli
from tests.helpers.dense_reference import mlp_reference, norm_reference, random_features, score_reference
from tests.helpers.kafka_io import header, produce
from tests.helpers.topology_process import (
    TopologyFiles,
    collect_outputs,
    pipeline_process,
    write_ensemble_topology,
    write_topology,
)

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

CHAIN_YAML = Path(__file__).resolve().parents[2] / "topologies" / "chain.yaml"
run_cli = functools.partial(cli.run_cli, timeout=180)


def _chain(tmp_path: Path, *, fused: bool, stages: list[dict[str, Any]] | None = None) -> TopologyFiles:
    """A private copy of ``topologies/chain.yaml``, with or without its ``fuse`` entry."""
    chain = yaml.safe_load(CHAIN_YAML.read_text())
    extra: dict[str, Any] = {"inputs": chain["inputs"], "outputs": chain["outputs"]}
    if fused:
        extra["fuse"] = chain["fuse"]
    return write_topology(tmp_path, partitions=2, stages=stages or chain["stages"], extra=extra)


def _run(
    topo: TopologyFiles, raw: np.ndarray, env: dict[str, str], bootstrap: str, tmp_path: Path, prefix: str = "req"
) -> tuple[dict[str, Any], str]:
    """Every request through ``topo``: correlation ID -> (outputs, stage, model-name, model-version);
    and the worker's log."""
    records = [encode_request({"raw": raw[i : i + 1]}, correlation_id=f"{prefix}-{i}") for i in range(len(raw))]

    def ours(rs: list[Any]) -> list[Any]:
        return [r for r in rs if (r.key or b"").decode().startswith(f"{prefix}-")]

    with pipeline_process(topo, env, tmp_path) as worker:
        asyncio.run(produce(bootstrap, topo.input_topic, records))
        out = collect_outputs(bootstrap, topo, lambda rs: len(ours(rs)) >= len(records), timeout=120)
        assert worker.terminate() == 0
        log = worker.log()
    assert out.on(topo.dead_letter_topic) == []
    results: dict[str, Any] = {}
    for record in ours(out.on(topo.result_topic)):
        response = decode_response(record.value, record.headers)
        assert set(response.outputs) == set(yaml.safe_load(topo.path.read_text())["outputs"]), "a full result"
        assert response.correlation_id not in results, "one outcome per record"
        results[response.correlation_id] = (
            response.outputs,
            header(record, "pipeline-stage"),
            header(record, "model-name"),
            header(record, "model-version"),
        )
    return results, log


def test_fused_chain_gives_the_unfused_results_through_one_triton_ensemble(
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    s3_settings: S3Settings,
    triton_settings: TritonSettings,
    tmp_path: Path,
) -> None:
    raw = random_features(300, seed=21)
    unfused_topo, fused_topo = _chain(tmp_path, fused=False), _chain(tmp_path, fused=True)
    unfused, _ = _run(unfused_topo, raw, cli_env, kafka_bootstrap, tmp_path)
    fused, log = _run(fused_topo, raw, cli_env, kafka_bootstrap, tmp_path)

    assert set(fused) == set(unfused) == {f"req-{i}" for i in range(len(raw))}
    ensemble = f"{fused_topo.name}--normalise--classify"
    assert f"ensemble {ensemble} pushed and loaded (steps normalise, classify)" in log
    for cid, (outputs, stage, model, version) in fused.items():
        i = int(cid.split("-")[1])
        logits = outputs["logits"]
        np.testing.assert_allclose(logits, unfused[cid][0]["logits"], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(logits, mlp_reference(norm_reference(raw[i : i + 1])), rtol=1e-4, atol=1e-5)
        assert (stage, model, version) == ("normalise--classify", ensemble, "1")
        assert unfused[cid][1:] == ("classify", "dense_classifier", "1")

    stored = {m.name: m for m in ModelStore(s3_settings).list_models()}
    assert stored[ensemble].versions == [1]
    with TritonAdmin(triton_settings) as admin:
        assert [e.state for e in admin.model_states(ensemble)] == ["READY"]
        described = admin.describe(ensemble)
        assert (described.platform, described.max_batch_size) == ("ensemble", 64)
        assert [t.name for t in described.inputs] == ["raw"] and [t.name for t in described.outputs] == ["logits"]
        assert admin.loaded_parameter(ensemble, STEPS_PARAMETER) == "normalise,classify"
        digest = admin.loaded_parameter(ensemble, DIGEST_PARAMETER)
        assert digest and len(digest) == 64

    # A second start with the same topology and members finds the ensemble current: no reload.
    second, log = _run(fused_topo, raw[:5], cli_env, kafka_bootstrap, tmp_path, prefix="again")
    assert set(second) == {f"again-{i}" for i in range(5)} and f"ensemble {ensemble} is current" in log
    with TritonAdmin(triton_settings) as admin:
        assert admin.loaded_parameter(ensemble, DIGEST_PARAMETER) == digest


def test_fusing_a_sequence_model_is_refused_by_validate_and_run(
    cli_env: dict[str, str], triton_settings: TritonSettings, tmp_path: Path
) -> None:
    stages = yaml.safe_load(CHAIN_YAML.read_text())["stages"]
    # A stateless step calling the sequence model: the file loads, only Triton knows what it is.
    stages[1] = {**stages[1], "model": "silero_vad", "input_map": {"audio": "features"}}
    topo = _chain(tmp_path, fused=True, stages=stages)
    reason = "fused step 'classify': model 'silero_vad' is a sequence model; it cannot be fused"

    validated = run_cli(cli_env, "validate", str(topo.path))
    assert validated.returncode == 1
    assert reason in " ".join((validated.stdout + validated.stderr).split())

    ran = run_cli(cli_env, "run", str(topo.path), "--http-port", "0")
    assert ran.returncode != 0
    assert reason in " ".join((ran.stdout + ran.stderr).split())
    with TritonAdmin(triton_settings) as admin:
        assert admin.model_states(f"{topo.name}--normalise--classify") == []


def test_fused_fan_out_and_join_gives_the_unfused_results_through_one_triton_ensemble(
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    triton_settings: TritonSettings,
    tmp_path: Path,
) -> None:
    raw = random_features(200, seed=23)
    fuse = [{"steps": ["normalise", "classify", "score"]}]
    unfused_topo = write_ensemble_topology(tmp_path)
    fused_topo = write_ensemble_topology(tmp_path, fuse=fuse)
    unfused, _ = _run(unfused_topo, raw, cli_env, kafka_bootstrap, tmp_path)
    fused, log = _run(fused_topo, raw, cli_env, kafka_bootstrap, tmp_path)

    assert set(fused) == set(unfused) == {f"req-{i}" for i in range(len(raw))}
    ensemble = f"{fused_topo.name}--normalise--score"
    assert f"ensemble {ensemble} pushed and loaded (steps normalise, classify, score)" in log
    for cid, (outputs, stage, model, version) in fused.items():
        i = int(cid.split("-")[1])
        features = norm_reference(raw[i : i + 1])
        for name, reference in (("logits", mlp_reference), ("score", score_reference)):
            np.testing.assert_allclose(outputs[name], unfused[cid][0][name], rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(outputs[name], reference(features), rtol=1e-4, atol=1e-5)
        # Header differences (docs): the fused stage writes the result, no join-result stage.
        assert (stage, model, version) == ("normalise--score", ensemble, "1")
        assert unfused[cid][1] == "join-result"

    with TritonAdmin(triton_settings) as admin:
        assert [e.state for e in admin.model_states(ensemble)] == ["READY"]
        described = admin.describe(ensemble)
        assert [t.name for t in described.inputs] == ["raw"]
        assert sorted(t.name for t in described.outputs) == ["logits", "score"]
        assert admin.loaded_parameter(ensemble, STEPS_PARAMETER) == "normalise,classify,score"


def test_fusing_the_branches_of_an_outer_join_is_a_located_error(cli_env: dict[str, str], tmp_path: Path) -> None:
    topo = write_ensemble_topology(tmp_path, mode="outer", fuse=[{"steps": ["normalise", "classify", "score"]}])
    result = run_cli(cli_env, "validate", "--offline", str(topo.path))
    assert result.returncode == 1
    text = " ".join((result.stdout + result.stderr).split())
    assert "the outer join of classify, score in front of the result would be inside the fused set" in text
    assert "only an inner join fuses" in text
    line = topo.path.read_text().splitlines().index("- steps:") + 1  # the fuse entry
    assert f"{topo.path}:{line}: fuse[0]:" in text, text
