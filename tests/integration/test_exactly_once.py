"""``delivery: exactly_once``: 3 × kill -9 of the stage under load lose nothing and repeat nothing
for a read_committed reader, on the stateless, audio and ensemble topologies side by side.

What it proves. With ``delivery: exactly_once`` a stage writes its outputs (and a sequence
stage's checkpoints, a join's state) and commits its input offsets in one Kafka transaction.
A worker killed with SIGKILL mid-transaction leaves that transaction open; its successor's
transactional producer (same transactional id, a higher epoch) fences it and the broker aborts
it, and the successor replays from the last committed offsets. So a reader that sees only
committed records sees every result exactly once however often the stage dies.

How. Each topology of the fault campaign (tests/helpers/fault_workloads.py) runs on its own
private topics with ``delivery: exactly_once``, all three at once (as test_replication_faults.py
runs them). Requests come from librdkafka's idempotent producer (tests/helpers/librdkafka_io.py:
a client that shares no code with us, left at its default partitioner, CRC32, which places keys
unlike the pipeline's murmur2; idempotent, so each request is on the input topic exactly once),
the workload's own encoded records paced evenly over ``SEND_S``. Each worker is killed with
SIGKILL ``KILLS`` times, spaced through the sending (and each time only once the worker before
has written results), and a new worker of the same groups is started at once. Then librdkafka's
consumer with ``isolation.level=read_committed`` (the transaction protocol as librdkafka reads
it, not our client) reads the result and dead-letter topics until every result is there, and
the test asserts, by each workload's identity of a result (``by_key``; ``by_stream_result`` for
audio):

- 0 lost: every expected result is there (each request's; each stream's chunk results, its
  speech segments and its summary);
- 0 duplicates and nothing extra;
- 0 dead letters;
- the results equal an analytic reference, the cheapest honest check (no fault-free reference
  run): stateless, numpy's forward pass of dense_classifier's ONNX weights; ensemble, the same
  for feature_norm → dense_classifier and feature_norm → anomaly_score (tests/helpers/
  dense_reference.py covers all three models); audio, the vendored Silero ONNX model run
  in-process chunk by chunk and the project's segment tracker over its probabilities
  (tests/helpers/streams.py: ``expected``, ``assert_stream_matches``);
- every stage's every committed input record has a committed outcome (the hop-by-hop audit of
  tests/helpers/outcome_audit.py over what read_committed shows of every topic);
- once the last worker is stopped (SIGTERM, exit code 0), read_committed reaches every
  partition's high watermark: no transaction was left open.

What read_uncommitted shows of the same result topics is printed and put in each row's note,
not asserted (a kill may by chance fall between two transactions): the aborted records of the
killed workers appear there as duplicates, which is what the transactions kept from a
read_committed reader. Each topology reports a row of the run's "fault figures"
(tests/helpers/figures.py): recovery is the longest, over the kills, from a kill to the first
committed result written after it (a result's timestamp is its producer's clock), each kill's
in the note with the longest pause in committed results between the first kill and the last.

Sizes, measured (2 cores, Apache Kafka 4.4 and Triton on the same machine, 2026-11-28):

- 30,000 requests each for stateless and ensemble; audio 316 streams of 79 to 107 chunks,
  30,137 chunks. The streams go out interleaved 32 at a time, wave after wave: silero_vad's
  sequence batcher holds 64 candidate sequences (sample_models/silero_vad/config.pbtxt) and
  316 streams open at once queue in Triton past the stages' 2 s call timeout (measured
  fault-free, at-least-once, all sent at once: 979 dead letters ``inference-failed: gave up
  after 5 attempts: [StatusCode.CANCELLED]``, 3,108 results lost, 262 s), while 64 streams
  at once (6,113 chunks) were answered in 9 s.
- Side by side, the module took 189-215 s (the test 173-193 s); one test per topology took
  307 s (stateless 68 s, audio 110 s, ensemble 111 s), hence side by side.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.contract.records import Record
from pipeline.contract.response import InferenceResponse, decode_response
from pipeline.topology import load_topology
from tests.helpers.dense_reference import mlp_reference, norm_reference, random_features, score_reference
from tests.helpers.fault_compare import Rec, RunOutputs, recovery_s
from tests.helpers.fault_workloads import Run, Workload, audio, ensemble, start_runs, start_workers, stateless
from tests.helpers.figures import FaultFigures, report
from tests.helpers.kafka_cluster_faults import longest_pause_s
from tests.helpers.kafka_io import header
from tests.helpers.librdkafka_io import PacedProducer, read_to_end, read_until
from tests.helpers.outcome_audit import account, hops
from tests.helpers.streams import UTTERANCES, assert_stream_matches, expected, gather, interleave

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

SCENARIO = "exactly-once: 3 × kill -9 (read_committed)"
DELIVERY: dict[str, Any] = {"delivery": "exactly_once"}
"""The topology-level setting under test (``{}``: the default, at-least-once)."""
REQUESTS = 30_000
"""Requests of the stateless and ensemble workloads."""
AUDIO_STREAMS = 316
"""Audio streams: 316 of 79 to 107 chunks each (by utterance) are 30,137 chunks."""
AUDIO_WAVE = 32
"""Audio streams open at once: the streams go out interleaved this many at a time, wave after wave."""
STATELESS_SEED, ENSEMBLE_SEED = 101, 102
SEND_S = 60.0
"""Each workload's requests go out evenly over this long."""
KILLS = 3
PARTITIONER = "consistent_random"
"""How the requests' producer places keys: librdkafka's default (CRC32), as a librdkafka client
left alone does, unlike Java's murmur2. The stages write to a next stage on their input's
partition number, so each intermediate partition keeps one writer either way (placed by the
key's murmur2, this run expired 8,771 ensemble windows and closed audio streams early)."""
RESULTS_TIMEOUT_S = 240.0
"""After the sending, how long a read_committed reader may wait for every result."""


@dataclass(frozen=True)
class Case:
    """A workload, what its committed results must be, and how they are checked."""

    workload: Workload
    expected: frozenset[Hashable]
    """Every result identity the run must show, once each."""
    check: Callable[[RunOutputs], list[str]]
    """The results against the reference: one line per difference."""


# ------------------------------------------------------------------ the three cases


def _stateless_case() -> Case:
    features = random_features(REQUESTS, STATELESS_SEED)
    return Case(
        stateless(REQUESTS, STATELESS_SEED),
        frozenset(f"sl-{i}".encode() for i in range(REQUESTS)),
        lambda out: _analytic_problems(out, "sl-", features, lambda f: {"logits": mlp_reference(f)}),
    )


def _ensemble_case() -> Case:
    raw = random_features(REQUESTS, ENSEMBLE_SEED)

    def reference(rows: np.ndarray) -> dict[str, np.ndarray]:
        features = norm_reference(rows)
        return {"logits": mlp_reference(features), "score": score_reference(features)}

    return Case(
        ensemble(REQUESTS, ENSEMBLE_SEED),
        frozenset(f"ens-{i}".encode() for i in range(REQUESTS)),
        lambda out: _analytic_problems(out, "ens-", raw, reference),
    )


def _audio_case() -> Case:
    keys = [f"audio-{i:02d}" for i in range(AUDIO_STREAMS)]
    identities: set[Hashable] = set()
    for i, key in enumerate(keys):
        want = expected(i % len(UTTERANCES))
        identities |= {(key.encode(), "chunk", str(c)) for c in range(want.chunks)}
        identities |= {(key.encode(), "segment", str(s)) for s in range(len(want.segments))}
        identities.add((key.encode(), "summary", str(want.chunks - 1)))
    return Case(
        _in_waves(audio(AUDIO_STREAMS), AUDIO_WAVE), frozenset(identities), lambda out: _stream_problems(out, keys)
    )


def _in_waves(workload: Workload, wave: int) -> Workload:
    """``workload``'s streams interleaved ``wave`` at a time, wave after wave (each stream's
    chunks keep their order)."""
    streams: dict[bytes | None, list[Record]] = {}
    for record in workload.records:
        streams.setdefault(record.key, []).append(record)
    keys = list(streams)
    waves = [interleave([streams[key] for key in keys[i : i + wave]]) for i in range(0, len(keys), wave)]
    return dataclasses.replace(workload, records=[record for records in waves for record in records])


def _analytic_problems(
    out: RunOutputs, prefix: str, inputs: np.ndarray, reference: Callable[[np.ndarray], dict[str, np.ndarray]]
) -> list[str]:
    """Each result's outputs (first delivery) against ``reference`` of its request's row."""
    firsts = {key: records[0] for key, records in out.results.items() if isinstance(key, bytes)}
    rows = np.array(sorted(int(key.decode().removeprefix(prefix)) for key in firsts), dtype=np.int64)
    if rows.size == 0:
        return ["no results to compare"]
    responses = [_response(firsts[f"{prefix}{row}".encode()]) for row in rows]
    problems = []
    for name, want in reference(inputs[rows]).items():
        got = np.concatenate([np.asarray(r.outputs[name], np.float64).reshape(1, -1) for r in responses])
        wrong = ~np.isclose(got, want.reshape(got.shape), rtol=1e-4, atol=1e-5).all(axis=1)
        if wrong.any():
            problems.append(
                f"{int(wrong.sum())} results' {name} differ from the reference, e.g. rows {rows[wrong][:3]}"
            )
    return problems


def _response(record: Rec) -> InferenceResponse:
    return decode_response(record.value, record.headers)


def _stream_problems(out: RunOutputs, keys: list[str]) -> list[str]:
    """Each stream's probabilities, segments and summary against the in-process Silero run."""
    streams = gather([records[0] for records in out.results.values()])
    problems = []
    for i, key in enumerate(keys):
        try:
            assert key in streams, f"{key}: no results"
            assert_stream_matches(streams[key], expected(i % len(UTTERANCES)), key)
        except AssertionError as failure:
            problems.append(str(failure).splitlines()[0])
    return problems


CASES: dict[str, Callable[[], Case]] = {"stateless": _stateless_case, "audio": _audio_case, "ensemble": _ensemble_case}


# ------------------------------------------------------------------ the run


def _kill_and_replace(runs: list[Run], started: float, kills: int) -> list[list[int]]:
    """SIGKILL every run's worker ``kills`` times, the k-th at ``started + SEND_S * k / (kills + 1)``
    (or later: once the worker before has produced results), each replaced by a new worker of
    the same groups at once. Returns each run's kill times (epoch ms)."""
    killed: list[list[int]] = [[] for _ in runs]
    for k in range(1, kills + 1):
        _wait_for_progress(runs)
        time.sleep(max(0.0, started + SEND_S * k / (kills + 1) - time.monotonic()))
        for i, run in enumerate(runs):
            run.worker.kill()
            killed[i].append(int(time.time() * 1000))
        start_workers([run.new_worker() for run in runs])
    _wait_for_progress(runs)
    return killed


def _wait_for_progress(runs: list[Run], timeout: float = 90.0) -> None:
    """Until each run's current worker has written a result (so a kill hits it mid-stream)."""
    deadline = time.monotonic() + timeout
    for run in runs:
        while run.worker.metric("pipeline_results_total") < 1:
            assert time.monotonic() < deadline, f"{run.workload.kind}: no progress\n{run.worker.log()}"
            time.sleep(0.1)


def _topics(run: Run) -> list[str]:
    return [run.topology.result_topic, run.topology.dead_letter_topic]


def _all_topics(run: Run) -> list[str]:
    topology = load_topology(run.topology.path)
    return sorted({t for hop in hops(topology) for t in (*hop.inputs, hop.output)} | {topology.dead_letter_topic})


def _judge(case: Case, run: Run, killed_ms: list[int], bootstrap: str) -> list[str]:
    """Report the run's figures row, and return what it broke (empty: exactly once)."""
    topology = run.topology
    committed = read_to_end(bootstrap, _all_topics(run), isolation="read_committed")
    out = RunOutputs.of(committed, topology, case.workload.identity)
    uncommitted = RunOutputs.of(
        read_to_end(bootstrap, _topics(run), isolation="read_uncommitted"), topology, case.workload.identity
    )
    audit = account(hops(load_topology(topology.path)), committed, topology.dead_letter_topic, topology.result_topic)
    lost = [i for i in case.expected if i not in out.results]
    extra = [i for i in out.results if i not in case.expected]
    recoveries = [recovery_s(out, at) for at in killed_ms]
    committed_records = sum(len(records) for records in out.results.values())
    uncommitted_records = sum(len(records) for records in uncommitted.results.values())
    note = (
        f"read_uncommitted sees {uncommitted.duplicates()} duplicates ({uncommitted_records - committed_records} "
        f"records of aborted transactions); after each kill "
        + "/".join("-" if r is None else f"{r:.1f}" for r in recoveries)
        + f" s; longest pause from the first kill to the last {longest_pause_s(out, killed_ms[0], killed_ms[-1]):.1f} s"
        + f"; audit: {audit.line()}"
    )
    print(f"\nexactly-once [{case.workload.kind}]: read_committed {committed_records} result records; {note}")
    report(
        FaultFigures(
            scenario=SCENARIO if DELIVERY else "at-least-once harness check: 3 × kill -9 (read_committed)",
            topology=case.workload.kind,
            sent=len(case.workload.records),
            results=len(out.results),
            duplicates=out.duplicates(),
            exact_duplicates=not out.inexact(),
            dead_letters=len(out.dead_letters),
            lost=len(lost),
            recovery_s=max((r for r in recoveries if r is not None), default=None),
            note=note,
        )
    )
    problems = [
        f"{len(items)} {what}, e.g. {items[:3]}"
        for what, items in (
            ("lost", lost),
            ("extra results", extra),
            ("duplicates", [i for i, records in out.results.items() if len(records) > 1]),
        )
        if items
    ]
    if out.dead_letters:
        problems.append(f"{len(out.dead_letters)} dead letters: {'; '.join(_dead_letter_kinds(out.dead_letters)[:5])}")
    problems += case.check(out) + audit.problems()
    problems += [f"no committed result after kill {k + 1}" for k, r in enumerate(recoveries) if r is None]
    return problems


def _dead_letter_kinds(records: list[Rec]) -> list[str]:
    """Each kind of dead letter (stage, class, reason's start) with its count, most first."""
    kinds = Counter(
        f"{header(r, 'error-stage')} {header(r, 'error-class')}: {(header(r, 'error-reason') or '')[:80]}"
        for r in records
    )
    return [f"{count} × {kind}" for kind, count in kinds.most_common()]


def _exactly_once(kinds: list[str], bootstrap: str, env: dict[str, str], tmp_path: Path) -> None:
    """The scenario on ``kinds`` side by side; fails naming every topology that broke a rule."""
    began = time.monotonic()
    cases = [CASES[kind]() for kind in kinds]
    runs = start_runs([case.workload for case in cases], env, tmp_path, **DELIVERY)
    try:
        started, killed = _send_and_kill(runs, bootstrap)
        sent_s = time.monotonic() - started
        for run in runs:
            read_until(
                bootstrap, _topics(run), run.workload.done, isolation="read_committed", timeout=RESULTS_TIMEOUT_S
            )
            code = run.worker.terminate()
            assert code == 0, f"{run.workload.kind}: exit code {code}\n{run.worker.log()}"
    finally:
        for run in runs:  # a failure above leaves no worker behind
            if run.worker.proc is not None and run.worker.proc.poll() is None:
                run.worker.kill()
    settled_s = time.monotonic() - started
    failures = [
        f"{run.workload.kind}: {problem}"
        for case, run, killed_ms in zip(cases, runs, killed, strict=True)
        for problem in _judge(case, run, killed_ms, bootstrap)
    ]
    print(
        f"\nexactly-once {kinds}: sent in {sent_s:.0f} s, every result committed and the workers stopped "
        f"{settled_s:.0f} s after the first request; {time.monotonic() - began:.0f} s in all"
    )
    assert not failures, "\n".join(failures)


def _send_and_kill(runs: list[Run], bootstrap: str) -> tuple[float, list[list[int]]]:
    """Each run's requests sent by librdkafka over ``SEND_S`` while its worker is killed
    ``KILLS`` times; returns when every request is delivered: when the sending began
    (monotonic) and each run's kill times (epoch ms)."""
    producers = [
        PacedProducer(
            bootstrap, run.topology.input_topic, run.workload.records, seconds=SEND_S, partitioner=PARTITIONER
        )
        for run in runs
    ]
    started = time.monotonic()
    for producer in producers:
        producer.start()
    killed = _kill_and_replace(runs, started, KILLS)
    for producer in producers:
        producer.join(timeout=SEND_S + 180)
        assert not producer.is_alive(), f"{producer.topic}: requests still being sent"
        assert producer.errors == [] and producer.undelivered == 0, (
            f"{producer.topic}: {len(producer.errors)} failed, {producer.undelivered} undelivered: {producer.errors[:3]}"
        )
    return started, killed


def test_three_kills_lose_and_repeat_nothing_for_a_read_committed_reader(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    _exactly_once(list(CASES), kafka_bootstrap, cli_env, tmp_path)
