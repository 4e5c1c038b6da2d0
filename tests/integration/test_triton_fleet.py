"""Stages on two Triton replicas (issue 27): two Tritons of this module's own, both loading
the session's model store (``EmbeddedStack(tritons=2)``, as `pipeline up --tritons 2`), named
together in ``PIPELINE_TRITON_GRPC_URL`` (``a:port,b:port``).

- Stateless (the dense_classifier workload, 400 one-row requests): every batch goes to the
  least busy replica that is up (workers/stateless/fleet_backend.py), so both serve, each
  30-70 % of the calls by Triton's own ``nv_inference_request_success``. kill -9 of one
  replica mid-run: its batches are retried on the other.
- Audio (DALI + the silero_vad sequence stage, 8 streams): each stream is pinned to one
  replica by its key (workers/sequence/model.py): each replica serves exactly the frames of
  the streams whose keys rank it highest (``pinned_endpoint``). kill -9 of the replica that
  served more frames: its streams move to the other with START and their checkpointed
  state. A replica that comes up mid-run takes only the streams pinned to it.

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
from pipeline.triton.replica_set import pinned_endpoint
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
from tests.helpers.topology_process import PipelineProcess

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

Pair = tuple[OwnTriton, OwnTriton]


@pytest.fixture(scope="module")
def pair(s3_settings: S3Settings, cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two Tritons on the session's store, started as `pipeline up --tritons 2` starts them."""
    with EmbeddedStack(
        services=("triton",), s3=s3_settings, tritons=2, log_dir=tmp_path_factory.mktemp("replicas")
    ) as stack:
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
    workloads: dict[str, Workload],
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
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


def _audio_frames(workload: Workload, endpoints: list[str]) -> list[int]:
    """The silero_vad calls each of ``endpoints`` must serve when every stream stays on the
    replica its key ranks highest on (one call per 32 ms frame, the offline model's count)."""
    frames = dict.fromkeys(endpoints, 0)
    for key in sorted({record.key for record in workload.records if record.key is not None}):
        index = int(key.decode().rsplit("-", 1)[1])
        frames[pinned_endpoint(key, endpoints)] += len(expected(index % 3).probabilities)
    return [frames[e] for e in endpoints]


def test_stateless_batches_spread_and_each_audio_stream_stays_on_its_replica(
    workloads: dict[str, Workload],
    references: dict[str, RunOutputs],
    pair: Pair,
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """No fault: both replicas serve the stateless batches (30-70 % each), and each replica
    serves exactly the audio frames of the streams pinned to it by key, so no frame of a
    stream went to the other replica."""
    env = _fleet_env(cli_env, pair)
    endpoints = [str(t.settings.grpc_url) for t in pair]
    models = ("dense_classifier", "silero_vad")
    before = {m: [_served(t.settings, m) for t in pair] for m in models}
    runs = producing_runs([workloads["stateless"], workloads["audio"]], env, tmp_path, kafka_bootstrap, seconds=8)
    outputs = finish_all(runs, kafka_bootstrap)
    served = {m: [_served(t.settings, m) - b for t, b in zip(pair, before[m], strict=True)] for m in models}
    shares = [count / sum(served["dense_classifier"]) for count in served["dense_classifier"]]
    pinned = _audio_frames(workloads["audio"], endpoints)
    notes = {
        "stateless": f"calls per replica {served['dense_classifier'][0]:.0f} / {served['dense_classifier'][1]:.0f} ({shares[0]:.0%} / {shares[1]:.0%})",
        "audio": f"frames per replica {served['silero_vad'][0]:.0f} / {served['silero_vad'][1]:.0f}, pinned by key {pinned[0]} / {pinned[1]}",
    }
    for kind in ("stateless", "audio"):
        comparison = compare(references[kind], outputs[kind], sent=len(workloads[kind].records))
        report(comparison.figures("two Triton replicas, no fault", kind, recovery_s=None, note=notes[kind]))
        assert comparison.problems() == [], kind
    assert all(0.3 <= share <= 0.7 for share in shares), (served, shares)
    # Exactly its pinned streams' frames; a frame retried on its own replica (a call that
    # timed out on a busy machine) counts twice, which a few frames of slack allow. A stream
    # served by the other replica would move a hundred frames or more.
    assert all(0 <= got - want <= 3 for got, want in zip(served["silero_vad"], pinned, strict=True)), (
        served["silero_vad"],
        pinned,
    )


def test_a_replica_joining_mid_run_takes_only_the_streams_pinned_to_it(
    workloads: dict[str, Workload],
    references: dict[str, RunOutputs],
    pair: Pair,
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Both replicas are listed, and the second answers nothing when the stage starts (frozen:
    as a new pod before it is ready, its set-up fails and is tried again) and becomes ready
    mid-run: the streams whose keys rank it highest move to it at a chunk boundary, with START
    and their checkpointed state; the others stay. Every output still equals the one-Triton
    reference (itself equal to the offline model)."""
    workload = workloads["audio"]
    env = _fleet_env(cli_env, pair)
    joining = pair[1]
    endpoints = [str(t.settings.grpc_url) for t in pair]
    before = [_served(t.settings, "silero_vad") for t in pair]
    joining.process.pause()
    try:
        runs = producing_runs([workload], env, tmp_path, kafka_bootstrap, seconds=16)
    finally:
        joining.process.resume()
    fault_end_ms = int(time.time() * 1000)
    joined = _joined(runs[0].worker, endpoints[1], timeout_s=30)
    outputs = finish_all(runs, kafka_bootstrap)
    on_first, on_joining = (_served(t.settings, "silero_vad") - b for t, b in zip(pair, before, strict=True))
    pinned = _audio_frames(workload, endpoints)
    movers = sum(
        1 for key in {r.key for r in workload.records if r.key} if pinned_endpoint(key, endpoints) == endpoints[1]
    )
    note = (
        f"joined {joined:.1f} s after it became ready; {movers} of 8 streams rank it highest; "
        f"frames {on_first:.0f} on the first replica, {on_joining:.0f} on the joining one"
    )
    judge(
        "a second Triton replica joins mid-run",
        outputs,
        references,
        {"audio": workload},
        fault_end_ms,
        notes={"audio": note},
    )
    # The first replica served every frame of its own streams, and the joining one only
    # frames of the streams pinned to it (those after it joined).
    assert on_first + on_joining >= sum(pinned)
    assert on_first >= pinned[0]
    assert on_joining <= pinned[1]
    assert (on_joining > 0) == (movers > 0), (on_joining, movers)


def _joined(worker: PipelineProcess, endpoint: str, timeout_s: float) -> float:
    """Seconds until the worker says ``endpoint`` is up (its replica set's log line)."""
    started = time.monotonic()
    while f"Triton replica {endpoint} is up" not in worker.log():
        assert time.monotonic() - started < timeout_s, f"replica {endpoint} never joined\n{worker.log()}"
        time.sleep(0.1)
    return time.monotonic() - started


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
        judge(
            "one of two Triton replicas kill -9",
            outputs,
            references,
            {kind: workload},
            fault_end_ms,
            notes={kind: note},
        )
    finally:
        victim.process.start()
    assert max(served) > 0 and took_over > 0
