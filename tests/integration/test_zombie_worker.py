"""Issue 10's zombie: a worker frozen past its session timeout must not corrupt the output
of the worker that took its partitions, once it runs again.

Two ``pipeline run`` processes (A and B) serve one topology on the real embedded stack, with
a 3 s consumer session (``PIPELINE_KAFKA_SESSION_TIMEOUT_MS``). Mid-stream, while A has work
in flight, A is frozen (SIGSTOP); the group drops it and B takes its partitions and goes on
(A is frozen again, up to FREEZES times, while a freeze left it nothing to fence).
Then A runs again (SIGCONT): whatever it had finished (results, and on the audio topology
the streams' checkpoints and the next frames of its streams for Triton's sequence state,
which B now drives under the same sequence ids) is due at once, before its heartbeat learns
it is out. The membership fence (pipeline/kafka/membership.py, workers/runtime/fencing.py) holds
all of it until the coordinator has answered, then drops it; A rejoins and takes a share
of the rest. Without the fence (checked once by disabling it), the audio run gave
conflicting duplicates and streams whose last checkpoint was not the reference's.

Checked against a fault-free reference run of the same records (tests/helpers/fault_compare.py):
nothing lost, missing, extra or changed, every duplicate byte-identical; the zombie counted
fenced outputs (``pipeline_fenced_outputs_total`` > 0); and on the audio topology the state
changelog ends with the same state per stream as the reference's: a late checkpoint of the
zombie, landing after the new owner's, would roll a stream back there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import re
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.kafka.changelog import read_changelog
from pipeline.settings import KafkaSettings
from pipeline.state.codec import decode_state
from tests.helpers.fault_compare import RunOutputs, compare
from tests.helpers.fault_workloads import FAST_FAILURES, Workload, audio, start_runs, stateless
from tests.helpers.figures import report
from tests.helpers.streams import DALI_STAGE, SEQUENCE_STAGE
from tests.helpers.topology_process import PipelineProcess, TopologyFiles, collect_outputs, write_topology
from workers.sequence.state import StreamState, StreamStateCodec

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow, pytest.mark.exclusive]  # measures time: alone

SESSION_MS = 3000
"""The group session here (default 10 s): the zombie's partitions move 3 s into the freeze."""
PRODUCE_S = {"stateless": 24.0, "audio": 24.0}
"""Records are sent evenly over this long: before, during and after the freezes (about 200
requests or 50 audio chunks a second: the workers are seldom idle)."""
FREEZES = 3
"""A is frozen again (after it rejoined) while it has fenced nothing: whether a freeze
catches it with finished but unsent outputs is a matter of milliseconds (on the audio
topology the DALI batch may just have left, and the sequence stage's next frames wait for
the lease before their Triton call, so they are handed back unfinished, not fenced)."""
STAGES = {"stateless": ["classify"], "audio": ["preprocess", "vad"]}
"""Each topology's stages; the last writes the result topic (audio: the stateful one)."""
QUEUE_DELAY_MS = 100.0
"""How long a request waits to fill a batch (stateless, DALI) here, a call slot free or not
(``hold_partial_batches``: the batcher is work conserving by default): a worker frozen
mid-stream then surely holds unfinished requests, which is what the fence is about."""


def _with_stages(workload: Workload, stages: list[dict[str, Any]]) -> Workload:
    def make(tmp_path: Path, extra: dict[str, Any]) -> TopologyFiles:
        return write_topology(tmp_path, partitions=2, stages=stages, extra=extra)

    return dataclasses.replace(workload, make_topology=make)


@pytest.fixture(scope="module")
def workloads() -> dict[str, Workload]:
    """fault_workloads' stateless and audio, more records (both workers stay busy while they
    are sent over PRODUCE_S), batches waiting up to QUEUE_DELAY_MS."""
    classify = {
        "name": "classify", "kind": "stateless", "model": "dense_classifier", **FAST_FAILURES,
        "batching": {"max_queue_delay_ms": QUEUE_DELAY_MS, "max_inflight_batches": 4, "hold_partial_batches": True},
    }
    preprocess = {
        **DALI_STAGE,
        "batching": {"max_batch_size": 64, "max_queue_delay_ms": QUEUE_DELAY_MS, "hold_partial_batches": True},
    }
    vad = {**SEQUENCE_STAGE, **FAST_FAILURES}
    return {
        "stateless": _with_stages(stateless(n=4800), [classify]),
        "audio": _with_stages(audio(streams=12), [preprocess, vad]),
    }


@pytest.fixture(scope="module")
def references(
    workloads: dict[str, Workload], kafka_bootstrap: str, cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[RunOutputs, TopologyFiles]]:
    """Each workload once, one worker, no fault: its outputs and its topology (audio's changelog)."""
    runs = start_runs(list(workloads.values()), cli_env, tmp_path_factory.mktemp("zombie-references"))
    for run in runs:
        run.produce(kafka_bootstrap, seconds=0)
    out = {run.workload.kind: (run.finish(kafka_bootstrap), run.topology) for run in runs}
    for kind, (outputs, _) in out.items():
        assert outputs.dead_letters == [], kind
        assert all(len(records) == 1 for records in outputs.results.values()), f"{kind}: a fault-free run has no duplicates"
    return out


def _assigned(worker: PipelineProcess, stage: str) -> set[int]:
    """Input partitions of ``stage`` in the worker's last "<stage>: assigned [...]" log line."""
    lines = [line for line in worker.log_path.read_text(errors="replace").splitlines() if f"{stage}: assigned " in line]
    return {int(p) for p in re.findall(r"partition=(\d+)", lines[-1])} if lines else set()


def _wait(condition: Any, timeout: float, what: str, *workers: PipelineProcess) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f}s\n" + "\n".join(w.log() for w in workers)
        time.sleep(0.02)


def _one_partition_each(zombie: PipelineProcess, peer: PipelineProcess, stage: str) -> None:
    _wait(lambda: len(_assigned(zombie, stage)) == 1 == len(_assigned(peer, stage)), 60, "a partition each", zombie, peer)


def _freeze(zombie: PipelineProcess, peer: PipelineProcess, kind: str) -> tuple[set[int], int, int]:
    """Freeze A at a moment it holds unfinished records, until B has taken its partitions
    and gone on for 2 s; return once A, running again, has handed its partitions back:
    the partitions it held, and when it was stopped and resumed (ms)."""
    stage = STAGES[kind][-1]
    busy = [lambda s=s: zombie.metric("pipeline_pending_requests", stage=s) > 0 for s in STAGES[kind]]
    _wait(lambda: all(each() for each in busy), 30, "A busy in every stage", zombie)
    handed_back = zombie.log_path.read_text(errors="replace").count(" handed back ")
    stopped_ms = int(time.time() * 1000)
    os.kill(zombie.pid, signal.SIGSTOP)
    held = _assigned(zombie, stage)
    try:
        # B takes every partition (the session expires, the group rebalances), and goes on.
        _wait(lambda: len(_assigned(peer, stage)) == 2, 60, "B taking A's partitions", peer)
        time.sleep(2.0)
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    resumed_ms = int(time.time() * 1000)
    every_stage = handed_back + len(STAGES[kind])
    log = zombie.log_path
    _wait(lambda: log.read_text(errors="replace").count(" handed back ") >= every_stage, 60, "A handing back", zombie)
    return held, stopped_ms, resumed_ms


def _final_states(bootstrap: str, topology: TopologyFiles) -> dict[bytes, StreamState]:
    """The last checkpoint of every stream in the sequence stage's changelog."""
    changelog = read_changelog(KafkaSettings(bootstrap_servers=bootstrap), f"{topology.name}.vad.state", [0, 1])
    tables = asyncio.run(changelog)
    return {key: decode_state(StreamStateCodec(), value) for table in tables.values() for key, value in table.items()}


def _same_state(a: StreamState, b: StreamState) -> bool:
    """Equal progress (indices, digests, samples, frames, end) and model and post-processor
    state within float tolerance; not ``last_ms``, the record timestamps of each run."""
    exact = ("key", "next_index", "frames_done", "samples_in", "ended", "digests", "skipped", "first_digest")
    return (
        all(getattr(a, name) == getattr(b, name) for name in exact)
        and np.allclose(a.carry, b.carry, atol=1e-6)
        and a.model_state.keys() == b.model_state.keys()
        and all(np.allclose(a.model_state[k], b.model_state[k], atol=1e-5) for k in a.model_state)
        and _close(a.post, b.post)
    )


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    return bool(a == b)


@pytest.mark.parametrize("kind", ["stateless", "audio"])
def test_a_frozen_worker_whose_partitions_moved_changes_no_output_when_it_runs_again(
    kind: str,
    workloads: dict[str, Workload],
    references: dict[str, tuple[RunOutputs, TopologyFiles]],
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    workload = workloads[kind]
    env = {**cli_env, "PIPELINE_KAFKA_SESSION_TIMEOUT_MS": str(SESSION_MS)}
    topology = workload.topology(tmp_path)
    zombie, peer = (PipelineProcess(topology, env, tmp_path / f"{name}-{uuid.uuid4().hex[:4]}.log") for name in "AB")
    stage = STAGES[kind][-1]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda worker: worker.start(), (zombie, peer)))
        _one_partition_each(zombie, peer, stage)
        producer = workload.producing(kafka_bootstrap, topology, seconds=PRODUCE_S[kind])
        _wait(lambda: zombie.metric("pipeline_results_total") >= 50, 60, "A answering", zombie)
        freezes = []
        for _ in range(FREEZES):
            freezes.append(_freeze(zombie, peer, kind))
            if zombie.metric("pipeline_fenced_outputs_total") > 0:
                break
            _one_partition_each(zombie, peer, stage)

        producer.join(timeout=120)
        collect_outputs(kafka_bootstrap, topology, workload.done, timeout=180)
        fenced = zombie.metric("pipeline_fenced_outputs_total")
        zombie_log = zombie.log_path.read_text(errors="replace")
        assert zombie.terminate() == 0, zombie.log()
        assert peer.terminate() == 0, peer.log()
    finally:
        for worker in (zombie, peer):
            if worker.proc is not None and worker.proc.poll() is None:
                os.kill(worker.pid, signal.SIGCONT)
                worker.proc.kill()
                worker.proc.wait(timeout=10)

    reference, reference_topology = references[kind]
    outputs = RunOutputs.read(kafka_bootstrap, topology, workload.identity)
    comparison = compare(reference, outputs, sent=len(workload.records))
    # Recovered: B's first result on a partition A held, while A was frozen (the first time).
    held_by_zombie, stopped_ms, resumed_ms = freezes[0]
    taken_over = [
        r.timestamp
        for records in outputs.results.values()
        for r in records
        if r.partition in held_by_zombie and stopped_ms <= r.timestamp < resumed_ms
    ]
    recovery = (min(taken_over) - stopped_ms) / 1000 if taken_over else None
    figures = comparison.figures(
        "zombie",
        kind,
        recovery_s=recovery,
        note=f"frozen {(resumed_ms - stopped_ms) / 1000:.1f} s, session {SESSION_MS / 1000:.0f} s, freezes {len(freezes)}; "
        f"the zombie fenced {fenced:.0f} outputs",
    )
    report(figures)
    comparison.assert_only_exact_duplicates()
    assert figures.lost == 0
    assert recovery is not None, "B produced nothing for A's partitions while A was frozen"
    # The fence did the work: A's lease expired on SIGCONT, the coordinator said it was out,
    # and what A had finished for partitions B now owned was dropped, not sent.
    assert "fencing started: membership of generation" in zombie_log, zombie_log[-4000:]
    assert "lost: coordinator answered error" in zombie_log, zombie_log[-4000:]
    assert fenced > 0, zombie_log[-4000:]

    if kind == "audio":
        final, want = _final_states(kafka_bootstrap, topology), _final_states(kafka_bootstrap, reference_topology)
        assert final.keys() == want.keys()
        rolled_back = sorted(key.decode() for key in want if not _same_state(final[key], want[key]))
        assert not rolled_back, f"streams whose last checkpoint differs from the reference's: {rolled_back}"
        assert all(state.ended for state in final.values())
