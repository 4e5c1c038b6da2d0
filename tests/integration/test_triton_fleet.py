"""A stateless stage on two Triton replicas (issue 27): the session's Triton and one of this
module's own, both loading the session's model store, named together in
``PIPELINE_TRITON_GRPC_URL`` (``a:port,b:port``). The stage keeps a channel to each and
sends every batch to the least busy one that is up (workers/stateless/fleet_backend.py).

- Spread: the dense_classifier workload (400 one-row requests over 8 s) is served by both,
  each replica taking 30-70 % of the calls by Triton's own ``nv_inference_request_success``.
- kill -9 of one replica mid-run: its batches are retried on the other, and every output
  compares with the fault-free reference run (tests/helpers/fault_compare.py): nothing
  lost or changed, every duplicate exact.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.settings import S3Settings, TritonSettings
from tests.helpers.fault_compare import RunOutputs, compare
from tests.helpers.fault_workloads import Workload, finish_all, judge, producing_runs, reference_outputs, stateless
from tests.helpers.figures import report
from tests.helpers.own_triton import OwnTriton, start_own_triton

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

MODEL = "dense_classifier"


@pytest.fixture(scope="module")
def second_triton(
    s3_settings: S3Settings, cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OwnTriton]:
    with start_own_triton(s3_settings, cli_env, tmp_path_factory.mktemp("second-triton")) as triton:
        yield triton


@pytest.fixture(scope="module")
def workload() -> Workload:
    return stateless()


@pytest.fixture(scope="module")
def reference(
    workload: Workload, kafka_bootstrap: str, cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, RunOutputs]:
    return reference_outputs([workload], kafka_bootstrap, cli_env, tmp_path_factory.mktemp("fleet-reference"))


def _fleet_env(cli_env: dict[str, str], first: TritonSettings, second: OwnTriton) -> dict[str, str]:
    return {**cli_env, "PIPELINE_TRITON_GRPC_URL": f"{first.grpc_url},{second.settings.grpc_url}"}


def _successes(settings: TritonSettings) -> float:
    """Triton's ``nv_inference_request_success`` for the model, all versions: the calls it served."""
    assert settings.metrics_url
    with urllib.request.urlopen(settings.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "nv_inference_request_success" and sample.labels.get("model") == MODEL
    )


def test_batches_are_spread_over_both_replicas(
    workload: Workload,
    reference: dict[str, RunOutputs],
    second_triton: OwnTriton,
    triton_settings: TritonSettings,
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    second_triton.heal()
    before = [_successes(triton_settings), _successes(second_triton.settings)]
    env = _fleet_env(cli_env, triton_settings, second_triton)
    runs = producing_runs([workload], env, tmp_path, kafka_bootstrap, seconds=8)
    outputs = finish_all(runs, kafka_bootstrap)
    served = [_successes(triton_settings) - before[0], _successes(second_triton.settings) - before[1]]
    shares = [count / sum(served) for count in served]
    comparison = compare(reference[workload.kind], outputs[workload.kind], sent=len(workload.records))
    note = f"calls per replica {served[0]:.0f} / {served[1]:.0f} ({shares[0]:.0%} / {shares[1]:.0%})"
    report(comparison.figures("two Triton replicas, no fault", workload.kind, recovery_s=None, note=note))
    assert comparison.problems() == []
    assert all(0.3 <= share <= 0.7 for share in shares), (served, shares)


def test_one_replica_killed_mid_run_loses_nothing(
    workload: Workload,
    reference: dict[str, RunOutputs],
    second_triton: OwnTriton,
    triton_settings: TritonSettings,
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    second_triton.heal()
    env = _fleet_env(cli_env, triton_settings, second_triton)
    runs = producing_runs([workload], env, tmp_path, kafka_bootstrap, seconds=12)
    before = _successes(triton_settings)
    second_triton.process.kill()
    fault_end_ms = int(time.time() * 1000)
    try:
        outputs = finish_all(runs, kafka_bootstrap)
        after_kill = _successes(triton_settings) - before
        retries = runs[0].worker.metric("pipeline_triton_retries_total")
        judge(
            "one of two Triton replicas kill -9",
            outputs,
            reference,
            {workload.kind: workload},
            fault_end_ms,
            notes={workload.kind: f"the other replica served {after_kill:.0f} calls after the kill; {retries:.0f} retried"},
        )
    finally:
        second_triton.process.start()
    assert after_kill > 0
