"""Stages on two Triton replicas (issue 27): two Tritons of this module's own, both loading
the session's model store (``EmbeddedStack(tritons=2)``, as `pipeline up --tritons 2`), named
together in ``PIPELINE_TRITON_GRPC_URL`` (``a:port,b:port``).

- Stateless (the dense_classifier workload, 400 one-row requests): every batch goes to the
  least busy replica that is up (workers/stateless/fleet_backend.py), so both serve, each
  30-70 % of the calls by Triton's own ``nv_inference_request_success``. kill -9 of one
  replica mid-run: its batches are retried on the other.
- Audio (DALI + the silero_vad sequence stage, 8 streams): each stream is pinned to one
  replica by its key (workers/sequence/model.py). kill -9 of the replica that served more
  frames: its streams move to the other with START and their checkpointed state.

Every output is compared with a fault-free run of the same records on one Triton
(tests/helpers/fault_compare.py: nothing lost or changed, every duplicate exact); the audio
reference itself equals the Silero model run offline.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.embedded.stack import EmbeddedStack
from pipeline.settings import S3Settings, TritonSettings
from pipeline.triton.admin import TritonAdmin
from tests.helpers.fault_compare import RunOutputs, compare
from tests.helpers.fault_workloads import (
    Workload,
    audio,
    finish_all,
    judge,
    producing_runs,
    reference_outputs,
    stateless,
)
from tests.helpers.figures import report
from tests.helpers.own_triton import OwnTriton
from tests.helpers.streams import assert_stream_matches, expected, gather

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

Pair = tuple[OwnTriton, OwnTriton]


@pytest.fixture(scope="module")
def pair(s3_settings: S3Settings, cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two Tritons on the session's store, started as `pipeline up --tritons 2` starts them."""
    with EmbeddedStack(services=("triton",), s3=s3_settings, tritons=2, log_dir=tmp_path_factory.mktemp("replicas")) as stack:
        assert stack.endpoints.triton.grpc_url == ",".join(str(r.grpc_url) for r in stack.triton_replicas)
        replicas = []
        for name, settings in zip(("triton", "triton-2"), stack.triton_replicas, strict=True):
            with TritonAdmin(settings) as admin:
                models = frozenset(e.name for e in admin.repository_index() if e.state == "READY")
            env = dict(cli_env, PIPELINE_TRITON_GRPC_URL=str(settings.grpc_url))
            replicas.append(OwnTriton(stack.process(name), env, settings, models))
        yield replicas[0], replicas[1]


@pytest.fixture(scope="module")
def workloads() -> dict[str, Workload]:
    return {w.kind: w for w in (stateless(), audio(streams=8))}


@pytest.fixture(scope="module")
def references(
    workloads: dict[str, Workload], kafka_bootstrap: str, cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, RunOutputs]:
    """Each workload without a fault on the session's one Triton; the audio streams checked
    against the model run offline, so the reference itself is right."""
    outputs = reference_outputs(list(workloads.values()), kafka_bootstrap, cli_env, tmp_path_factory.mktemp("refs"))
    streams = gather([r for records in outputs["audio"].results.values() for r in records])
    for i, key in enumerate(sorted(streams)):
        assert_stream_matches(streams[key], expected(i % 3), key)
    return outputs


def _fleet_env(cli_env: dict[str, str], pair: Pair) -> dict[str, str]:
    for triton in pair:
        triton.heal()
    return {**cli_env, "PIPELINE_TRITON_GRPC_URL": ",".join(str(t.settings.grpc_url) for t in pair)}


def _served(settings: TritonSettings, model: str) -> float:
    """Triton's ``nv_inference_request_success`` for ``model``, all versions: the calls it served."""
    assert settings.metrics_url
    with urllib.request.urlopen(settings.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        # the parser names a counter's samples ..._total, which Triton's own text does not
        if family.name == "nv_inference_request_success" and sample.labels.get("model") == model
    )


def test_stateless_batches_are_spread_over_both_replicas(
    workloads: dict[str, Workload],
    references: dict[str, RunOutputs],
    pair: Pair,
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    workload = workloads["stateless"]
    env = _fleet_env(cli_env, pair)
    before = [_served(t.settings, "dense_classifier") for t in pair]
    runs = producing_runs([workload], env, tmp_path, kafka_bootstrap, seconds=8)
    outputs = finish_all(runs, kafka_bootstrap)
    served = [_served(t.settings, "dense_classifier") - b for t, b in zip(pair, before, strict=True)]
    shares = [count / sum(served) for count in served]
    comparison = compare(references["stateless"], outputs["stateless"], sent=len(workload.records))
    note = f"calls per replica {served[0]:.0f} / {served[1]:.0f} ({shares[0]:.0%} / {shares[1]:.0%})"
    report(comparison.figures("two Triton replicas, no fault", "stateless", recovery_s=None, note=note))
    assert comparison.problems() == []
    assert all(0.3 <= share <= 0.7 for share in shares), (served, shares)


@pytest.mark.parametrize(("kind", "model"), [("stateless", "dense_classifier"), ("audio", "silero_vad")])
def test_one_replica_killed_mid_run_loses_and_changes_nothing(
    kind: str,
    model: str,
    workloads: dict[str, Workload],
    references: dict[str, RunOutputs],
    pair: Pair,
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    workload = workloads[kind]
    env = _fleet_env(cli_env, pair)
    runs = producing_runs([workload], env, tmp_path, kafka_bootstrap, seconds=12)
    served = [_served(t.settings, model) for t in pair]
    # The replica that served more: a stateless stage's batches, or the streams pinned to it.
    victim, survivor = (pair[0], pair[1]) if served[0] >= served[1] else (pair[1], pair[0])
    survivor_before = _served(survivor.settings, model)
    victim.process.kill()
    fault_end_ms = int(time.time() * 1000)
    try:
        outputs = finish_all(runs, kafka_bootstrap)
        took_over = _served(survivor.settings, model) - survivor_before
        note = f"calls before the kill {served[0]:.0f} / {served[1]:.0f} (since the module began); after it the other replica served {took_over:.0f}"
        judge("one of two Triton replicas kill -9", outputs, references, {kind: workload}, fault_end_ms, notes={kind: note})
    finally:
        victim.process.start()
    assert max(served) > 0 and took_over > 0
