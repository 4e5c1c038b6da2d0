"""Issue 10's Triton-side fault campaign, on the real embedded stack.

Each scenario runs the stateless, audio (DALI + sequence) and ensemble (fan-out + join)
topologies (tests/helpers/fault_workloads.py) against a Triton of this module's own, applies
one fault mid-stream, and compares every output with a fault-free reference run of the same
records (tests/helpers/fault_compare.py): nothing lost, missing, extra or changed, every
duplicate byte-identical to the first, no dead letter the reference does not have (beyond
the ones a scenario causes on purpose). Each reports its figures (tests/helpers/figures.py,
printed in the run's "fault figures" summary). Recovery is measured from the fault's end to
the first result produced after it (the result record's timestamp): SIGCONT; the model
loaded again; Triton ready again after its restart; in the SIGTERM scenario Triton ready
again (so it includes starting the next workers); after a corrupt checkpoint, the
restarted workers ready.

Faults that hit the whole server (freeze, kill -9, an outage under SIGTERM) run the three
topologies side by side on one fault, as three deployments sharing one Triton would see it;
the 30 s freeze then costs 30 s once, not three times.

- frozen: SIGSTOP to Triton's process group for 30 s, then SIGCONT. Calls time out
  (``call_timeout_s`` 2 s), the readiness probe does not answer, so it is an outage: batches
  wait, readiness goes off, nothing is dead-lettered.
- one model unloaded while Triton lives (the repository API), then loaded again: that
  stage's requests wait (model not loaded = an outage of the stage); other models serve on.
- kill -9 of Triton and a restart on the same ports (every sequence's Triton state gone).
- SIGTERM to the workers while Triton is down: each exits 0 within its drain bound, having
  committed nothing it had not answered; workers started after Triton returns answer all.
- a corrupt checkpoint in the changelog of the sequence stage (audio) and of the join
  (ensemble), read when a restarted worker restores: dead-lettered (``corrupt-state``, the
  record byte for byte), counted, its key starts fresh, and nothing else changes.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.contract.records import Record
from pipeline.settings import S3Settings
from tests.helpers.fault_compare import Rec, RunOutputs
from tests.helpers.fault_workloads import (
    CALL_TIMEOUT_S,
    Run,
    Workload,
    audio,
    ensemble,
    finish_all,
    judge,
    producing_runs,
    reference_outputs,
    start_runs,
    start_workers,
    stateless,
    wait_for_results,
)
from tests.helpers.kafka_io import header, produce
from tests.helpers.own_triton import OwnTriton, start_own_triton
from tests.helpers.streams import assert_stream_matches, expected, gather
from tests.helpers.topology_process import PipelineProcess

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

FREEZE_S = 30.0
"""The issue's figure: Triton stopped for 30 s."""
UNLOAD_S = 8.0
DRAIN_TIMEOUT_S = 10.0
"""The topology's drain bound in the SIGTERM scenario (default 30 s; shorter keeps CI quick)."""
JOIN_WINDOW_MS = 90_000.0
"""The ensemble's inner-join window here (topologies/ensemble.yaml: 5 s). A join window is
counted from the first branch's arrival, and a branch whose stage waits out an outage
arrives that much later: with 5 s, every correlation ID one branch answered before a
longer outage is dead-lettered twice (the expired join, then the late branch), none lost.
A window longer than the longest outage a deployment must ride out avoids that; these
tests use one, so they test everything else."""
CORRUPT_SEQUENCE = b'{"v": 2, "kind": "sequence", "state": {"next_index": "x"}}'
CORRUPT_JOIN = b"\xff\x00 not a checkpoint"
ALL = ("stateless", "audio", "ensemble")


def _now_ms() -> int:
    return int(time.time() * 1000)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def workloads() -> dict[str, Workload]:
    return {w.kind: w for w in (stateless(), audio(), ensemble(window_ms=JOIN_WINDOW_MS))}


@pytest.fixture(scope="module")
def module_triton(
    s3_settings: S3Settings, cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OwnTriton]:
    """One Triton for the whole campaign (starting one per test would cost minutes)."""
    with start_own_triton(s3_settings, cli_env, tmp_path_factory.mktemp("fault-triton")) as triton:
        yield triton


@pytest.fixture(scope="module")
def references(
    workloads: dict[str, Workload],
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, RunOutputs]:
    """Each workload once without a fault (the session's Triton); the audio one is also
    checked against the Silero model run offline, so the reference itself is right."""
    outputs = reference_outputs(
        list(workloads.values()), kafka_bootstrap, cli_env, tmp_path_factory.mktemp("references")
    )
    streams = gather([r for records in outputs["audio"].results.values() for r in records])
    for i, key in enumerate(sorted(streams)):
        assert_stream_matches(streams[key], expected(i % 3), key)
    return outputs


@dataclass(frozen=True)
class Campaign:
    """What every scenario needs: the workloads and their references, the Triton to hurt
    (healed before each scenario), the broker, and the scenario's own folder."""

    workloads: dict[str, Workload]
    references: dict[str, RunOutputs]
    triton: OwnTriton
    bootstrap: str
    tmp_path: Path

    def start(self, kinds: Sequence[str], *, seconds: float = 0.0, held_back: int = 0, **extra: Any) -> list[Run]:
        """Workers for ``kinds`` on this Triton, sending their records over ``seconds``;
        returned once each has produced results, so a fault applied now hits mid-stream."""
        workloads = [self.workloads[kind] for kind in kinds]
        return producing_runs(
            workloads, self.triton.env, self.tmp_path, self.bootstrap, seconds=seconds, held_back=held_back, **extra
        )

    def judge(self, scenario: str, outputs: dict[str, RunOutputs], fault_end_ms: int, **kw: Any) -> None:
        judge(scenario, outputs, self.references, self.workloads, fault_end_ms, **kw)


@pytest.fixture
def campaign(
    workloads: dict[str, Workload],
    references: dict[str, RunOutputs],
    module_triton: OwnTriton,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> Campaign:
    module_triton.heal()  # whatever the previous scenario left, even if it failed
    return Campaign(workloads, references, module_triton, kafka_bootstrap, tmp_path)


# ------------------------------------------------------------------ (a) frozen


def test_triton_frozen_for_30_s_is_waited_out(campaign: Campaign) -> None:
    runs = campaign.start(ALL, seconds=FREEZE_S + 15)
    campaign.triton.process.pause()
    try:
        time.sleep(FREEZE_S)
        readiness = {run.workload.kind: run.worker.get("/readyz")[0] for run in runs}
        retries = {run.workload.kind: run.worker.metric("pipeline_triton_retries_total") for run in runs}
    finally:
        campaign.triton.process.resume()
    fault_end_ms = _now_ms()
    outputs = finish_all(runs, campaign.bootstrap)
    notes = {kind: f"{retries[kind]:.0f} calls retried, /readyz {readiness[kind]} while frozen" for kind in outputs}
    campaign.judge("triton frozen 30 s", outputs, fault_end_ms, notes=notes)
    # The calls really did time out and wait (not served by luck before the freeze), and
    # the watchdog said so.
    assert all(count > 0 for count in retries.values()), retries
    assert set(readiness.values()) == {503}, readiness


# ------------------------------------------------------------------ (b) one model unloaded

UNLOADED = [("stateless", "dense_classifier"), ("audio", "silero_vad"), ("ensemble", "anomaly_score")]


@pytest.mark.parametrize(("kind", "model"), UNLOADED, ids=[kind for kind, _ in UNLOADED])
def test_one_model_unloaded_while_triton_lives_is_waited_out(kind: str, model: str, campaign: Campaign) -> None:
    (run,) = campaign.start([kind], seconds=UNLOAD_S + 12)
    # Stages that do not call the unloaded model (the ensemble's normalise and classify).
    others = [s for s in ("normalise", "classify") if kind == "ensemble"]
    with campaign.triton.admin() as admin:
        admin.unload(model)
        before = {s: run.worker.metric("pipeline_results_total", stage=s) for s in others}
        time.sleep(UNLOAD_S)
        dead_while_unloaded = run.worker.metric("pipeline_dead_letters_total")
        served = {s: run.worker.metric("pipeline_results_total", stage=s) - before[s] for s in others}
        retries = run.worker.metric("pipeline_triton_retries_total")
        admin.load(model)
    fault_end_ms = _now_ms()
    outputs = {kind: run.finish(campaign.bootstrap)}
    note = f"{model} unloaded {UNLOAD_S:g} s; {retries:.0f} calls retried" + "".join(
        f"; {stage} served {count:.0f} meanwhile" for stage, count in served.items()
    )
    campaign.judge(f"model {model} unloaded", outputs, fault_end_ms, notes={kind: note})
    assert dead_while_unloaded == 0
    assert retries > 0, "the stage never found the model missing"
    assert all(count > 0 for count in served.values()), f"other models must keep serving: {served}"


# ------------------------------------------------------------------ (c) kill -9 and restart


def test_triton_killed_and_restarted_on_the_same_ports(campaign: Campaign) -> None:
    runs = campaign.start(ALL, seconds=30)
    campaign.triton.process.kill()  # SIGKILL to the group: every sequence's state in Triton is gone
    killed = time.monotonic()
    time.sleep(2)
    campaign.triton.process.start()  # same argv, same ports; returns once it is ready again
    down_s = time.monotonic() - killed
    fault_end_ms = _now_ms()
    outputs = finish_all(runs, campaign.bootstrap)
    notes = dict.fromkeys(outputs, f"Triton down {down_s:.1f} s")
    campaign.judge("triton kill -9 + restart", outputs, fault_end_ms, notes=notes)


# ------------------------------------------------------------------ (d) SIGTERM during an outage


def _sigterm_all(workers: Sequence[PipelineProcess], timeout: float) -> list[tuple[int | None, float]]:
    """SIGTERM every worker at once; each one's exit code and seconds to exit."""
    started = time.monotonic()
    for worker in workers:
        assert worker.proc is not None
        worker.proc.send_signal(signal.SIGTERM)
    exits: dict[int, tuple[int | None, float]] = {}
    while len(exits) < len(workers) and time.monotonic() - started < timeout:
        for i, worker in enumerate(workers):
            if i not in exits and worker.proc is not None and worker.proc.poll() is not None:
                exits[i] = (worker.proc.returncode, time.monotonic() - started)
        time.sleep(0.05)
    return [exits.get(i, (None, timeout)) for i in range(len(workers))]


@pytest.mark.exclusive  # measures its exit against the drain bound
def test_sigterm_during_a_triton_outage_exits_in_bound_and_loses_nothing(campaign: Campaign) -> None:
    runs = campaign.start(ALL, seconds=8, drain_timeout_s=DRAIN_TIMEOUT_S)
    campaign.triton.process.kill()
    deadline = time.monotonic() + 30
    while any(run.worker.metric("pipeline_triton_retries_total") == 0 for run in runs):
        assert time.monotonic() < deadline, "no stage noticed the outage"
        time.sleep(0.1)
    for run in runs:
        assert run.producer is not None
        run.producer.join(timeout=60)  # everything is in Kafka; much of it unanswered
    time.sleep(CALL_TIMEOUT_S)
    exits = _sigterm_all([run.worker for run in runs], timeout=DRAIN_TIMEOUT_S + 30)
    answered = {
        run.workload.kind: len(RunOutputs.read(campaign.bootstrap, run.topology, run.workload.identity).results)
        for run in runs
    }
    logs = {run.workload.kind: run.worker.log() for run in runs}
    campaign.triton.process.start()
    fault_end_ms = _now_ms()  # recovery includes starting the next workers
    start_workers([run.new_worker() for run in runs])
    outputs = finish_all(runs, campaign.bootstrap)
    expected_results = {kind: len(campaign.references[kind].results) for kind in outputs}
    notes = {
        run.workload.kind: f"exit {code} after {seconds:.1f} s (drain bound {DRAIN_TIMEOUT_S:g} s); "
        f"{answered[run.workload.kind]} of {expected_results[run.workload.kind]} answered before it"
        for run, (code, seconds) in zip(runs, exits, strict=True)
    }
    campaign.judge("SIGTERM during Triton outage", outputs, fault_end_ms, notes=notes)
    for run, (code, seconds) in zip(runs, exits, strict=True):
        kind = run.workload.kind
        assert code == 0, f"{kind}: exit code {code}\n{logs[kind]}"
        assert seconds <= DRAIN_TIMEOUT_S + 5, f"{kind}: took {seconds:.1f} s\n{logs[kind]}"
        assert answered[kind] < expected_results[kind], f"{kind}: nothing was left unanswered"


# ------------------------------------------------------------------ (e) corrupt checkpoints


def _split(workload: Workload, later: set[bytes], share: float) -> tuple[list[Record], list[Record]]:
    """The records before a restart (``share`` of those not keyed ``later``) and after it."""
    early = [r for r in workload.records if r.key not in later]
    cut = int(len(early) * share)
    return early[:cut], early[cut:] + [r for r in workload.records if r.key in later]


def _restored(worker: PipelineProcess, corrupt: int, timeout: float = 30.0) -> float:
    """Corrupt checkpoints the worker has counted once ``corrupt`` are (its partitions are
    restored on assignment, which may come a little after it reports ready)."""
    deadline = time.monotonic() + timeout
    while (counted := worker.metric("pipeline_state_corrupt_total")) < corrupt and time.monotonic() < deadline:
        time.sleep(0.1)
    return counted


def test_a_corrupt_checkpoint_is_dead_lettered_and_nothing_else_changes(campaign: Campaign) -> None:
    """The corrupt records are for keys whose records come after the restart: the key
    starts fresh, so its results must equal the reference's (a corrupt checkpoint of a live
    stream loses that stream's progress: it is dead-lettered and counted all the same).

    The second half is sent while the workers are down, as by clients that keep sending
    through a restart. Sent only once both restarted workers had restored (13 s after the
    audio worker's restore in one run), it came more than the VAD model's 10 s idle timeout
    after the first half, in event time as on the wall clock, with nothing of those streams
    left upstream: the stage rightly closed them as idle, which is not this test's fault."""
    corrupt = {
        "audio": ("vad", {b"audio-03": CORRUPT_SEQUENCE}),
        "ensemble": ("join-result", {b"ens-390": CORRUPT_JOIN, b"ens-391": CORRUPT_SEQUENCE, b"ens-399": b""}),
    }
    runs = start_runs([campaign.workloads[kind] for kind in corrupt], campaign.triton.env, campaign.tmp_path)
    halves = {run.workload.kind: _split(run.workload, set(corrupt[run.workload.kind][1]), 0.6) for run in runs}
    for run in runs:
        asyncio.run(produce(campaign.bootstrap, run.topology.input_topic, halves[run.workload.kind][0]))
    wait_for_results(runs, 100)
    for run in runs:
        stage, garbage = corrupt[run.workload.kind]
        checkpoints = [Record(key=key, value=value, headers=[]) for key, value in garbage.items()]
        asyncio.run(produce(campaign.bootstrap, f"{run.topology.name}.{stage}.state", checkpoints))
        assert run.worker.terminate() == 0, run.worker.log()
    for run in runs:
        asyncio.run(produce(campaign.bootstrap, run.topology.input_topic, halves[run.workload.kind][1]))
    fault_end_ms = _now_ms()  # the restart: the backlog may be served before the workers report ready
    start_workers([run.new_worker() for run in runs])  # each restores its partitions: the corrupt ones too
    counted = {run.workload.kind: _restored(run.worker, len(corrupt[run.workload.kind][1])) for run in runs}
    outputs = finish_all(runs, campaign.bootstrap)

    def is_injected(record: Rec) -> bool:
        garbage = {k: v for _, written in corrupt.values() for k, v in written.items()}
        return header(record, "error-class") == "corrupt-state" and garbage.get(record.key) == (record.value or b"")

    notes = {
        kind: f"{len(corrupt[kind][1])} corrupt checkpoints written, {counted[kind]:.0f} counted" for kind in outputs
    }
    campaign.judge("corrupt checkpoint", outputs, fault_end_ms, notes=notes, expected_dead=is_injected)
    for kind, out in outputs.items():
        letters = sorted(r.key for r in out.dead_letters)
        assert letters == sorted(corrupt[kind][1]), f"{kind}: each corrupt checkpoint dead-lettered once: {letters}"
        assert counted[kind] == len(corrupt[kind][1]), kind


# ------------------------------------------------------------------ (f) a rebalance storm

STORM_S = 24.0
STORM_EVERY_S = 4.0
STORM_HELD_BACK = 20


def _stop_side_by_side(pool: ThreadPoolExecutor, workers: list[PipelineProcess]) -> None:
    """SIGTERM ``workers`` at once, each exiting cleanly or (before its handlers) by the signal."""
    for worker, code in zip(workers, pool.map(PipelineProcess.terminate, workers), strict=True):
        assert code in (0, -signal.SIGTERM), worker.log()


def test_a_rebalance_storm_downstream_of_stateless_dali_and_join_stages_loses_nothing(campaign: Campaign) -> None:
    """No Triton fault: Triton is healthy, and this campaign's references serve. For 24 s, an
    extra worker of every topology joins, or leaves (SIGTERM), every 4 s, so every stage,
    those behind the stateless, DALI and join stages included, rebalances again and again
    while several processes write each intermediate partition (the load that made the
    embedded broker skip offsets, issue 25). Beyond the comparison with the reference, each
    run's outcome audit (in ``Run.finish``) accounts for every record each stage consumed.

    The last 20 requests of the stateless and ensemble runs go out only after the storm: the
    extra workers' exits can stretch it past the sending (a CI run's storm took 36 s, and the
    stateless run had answered everything before it ended, so nothing showed its recovery)."""
    runs = campaign.start(ALL, seconds=STORM_S + 10, held_back=STORM_HELD_BACK)
    extra: dict[str, PipelineProcess | None] = dict.fromkeys(ALL)
    changes, deadline = 0, time.monotonic() + STORM_S
    with ThreadPoolExecutor(len(ALL)) as starting, ThreadPoolExecutor(len(ALL)) as stopping:
        while time.monotonic() < deadline:
            leaving = []
            for run in runs:
                worker = extra[run.workload.kind]
                if worker is None:  # joins every group of the topology, without waiting for it
                    extra[run.workload.kind] = worker = run.new_worker_beside()
                    starting.submit(worker.start)
                else:  # leaves them; SIGTERM before its handlers are in place is a crash, also fine
                    leaving.append(worker)
                    extra[run.workload.kind] = None
            _stop_side_by_side(stopping, leaving)
            changes += 1
            time.sleep(STORM_EVERY_S)
        _stop_side_by_side(stopping, [worker for worker in extra.values() if worker is not None])
    fault_end_ms = _now_ms()
    skipped = {run.workload.kind: run.worker.metric("pipeline_offsets_skipped_total") for run in runs}
    outputs = finish_all(runs, campaign.bootstrap)
    notes = {kind: f"{changes} membership changes in {STORM_S:g} s" for kind in outputs}
    campaign.judge("rebalance storm", outputs, fault_end_ms, notes=notes)
    print(f"broker skips caught by the workers that stayed: {skipped}")
