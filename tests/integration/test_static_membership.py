"""Back in seconds after a crash: static group membership (KIP-345) on Apache Kafka.

``pipeline run --processes 2`` with ``PIPELINE_KAFKA_GROUP_INSTANCE_ID`` set gives each
child a stable name in every stage's group (``<name>-<index>``). A child killed with
SIGKILL is started again by the supervisor under the same name, and the broker hands it
its partitions back at once: no rebalance, no wait for the dead member's session to time
out. The same run without the setting (dynamic membership) is the baseline: its killed
child's partitions wait for the session timeout (10 s here, the default).

The gap measured is, per result partition the killed child served, the longest silence
between two consecutive results (broker append times) while requests kept arriving.
Apache Kafka, not the embedded broker: Tansu holds every JoinGroup about 8 s, static or
not (measured 2026-11-27: a replacement with the same instance id was assigned its
partition after 8.0 s), so it cannot show the difference.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from pipeline.client import Client, ClientError, InferResult
from pipeline.embedded.stack import EmbeddedStack
from pipeline.errors import PipelineError
from pipeline.settings import KafkaSettings
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.fault_compare import RunOutputs
from tests.helpers.fault_workloads import Workload, audio, ensemble, stateless
from tests.helpers.figures import FaultFigures, report
from tests.helpers.kafka_io import collect
from tests.helpers.outcome_audit import audit_outcomes
from tests.helpers.topology_process import PipelineProcess, TopologyFiles, collect_outputs, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow, pytest.mark.exclusive]  # measures a gap

N = 3_000
PRODUCE_S = 20.0
SESSION_MS = 10_000
STATIC_GAP_BOUND_S = 3.0
"""Issue 26's bound. Measured alone on the 2-core machine (2026-11-27): 2.9 s twice while the
supervisor started a fresh child (2.2-2.7 s of its start-up, most of it imports); 0.4 s once
the warm standby replaces it (imported, topology loaded: the join and the stage's setup are
what is left)."""
SCALE_DOWN_REBALANCE_S = 5.0
"""After the leave: the broker's rebalance, the stayer's next heartbeat (1 s apart:
``pipeline.kafka.clients``), its join and restore. Under the session timeout: a static member
stopped cleanly leaves its group (``pipeline.kafka.static_leave``) instead of waiting it out
(10.9 s with a 10 s session before it did, 2026-11-27)."""


@pytest.fixture(scope="module")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    stack = EmbeddedStack(services=("kafka",), broker="kafka", log_dir=tmp_path_factory.mktemp("apache-kafka") / "logs")
    try:
        stack.start()
    except PipelineError as exc:
        pytest.fail(f"Apache Kafka did not start: {exc}")
    try:
        yield str(stack.endpoints.kafka.bootstrap_servers)
    finally:
        stack.stop()


async def _result_times(bootstrap: str, topic: str) -> dict[int, list[float]]:
    """Per result partition, the append times (s) of its records, in offset order."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    times: dict[int, list[float]] = {}
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=2000)
            if not batch:
                return times
            for tp, records in batch.items():
                times.setdefault(tp.partition, []).extend(r.timestamp / 1000 for r in records)
    finally:
        await consumer.stop()


@contextlib.contextmanager
def _supervised(topo: TopologyFiles, env: dict[str, str], log: Path) -> Iterator[tuple[PipelineProcess, list[int]]]:
    """``pipeline run --processes 2`` on ``topo``, both children ready: (supervisor, their ports)."""
    supervisor = PipelineProcess(topo, env, log, args=["--processes", "2"]).start()
    ports = [supervisor.http_port, supervisor.http_port + 1]
    try:
        wait_until(
            lambda: all(supervisor.get("/readyz", p)[0] == 200 for p in ports),
            "both children ready",
            supervisor,
            timeout=90.0,
        )
        yield supervisor, ports
    finally:
        if supervisor.proc is not None and supervisor.proc.poll() is None:
            supervisor.kill()


def _env(cli_env: dict[str, str], bootstrap: str, *, static: bool) -> dict[str, str]:
    env = dict(cli_env, PIPELINE_KAFKA_BOOTSTRAP_SERVERS=bootstrap, PIPELINE_KAFKA_SESSION_TIMEOUT_MS=str(SESSION_MS))
    env.pop("PIPELINE_KAFKA_GROUP_INSTANCE_ID", None)
    if static:
        env["PIPELINE_KAFKA_GROUP_INSTANCE_ID"] = f"static-{uuid.uuid4().hex[:6]}"
    return env


def _kill_once_both_serve(supervisor: PipelineProcess, ports: list[int]) -> float:
    """SIGKILL the second child once both have results and a steady stream ran 2 s: the kill's time."""
    wait_until(
        lambda: all(supervisor.metric("pipeline_results_total", p) > 0 for p in ports),
        "results from both",
        supervisor,
        timeout=90.0,
    )
    time.sleep(2.0)  # a steady stream on both children's partitions before the kill
    killed_at = time.time()
    os.kill(supervisor.children()[ports[1]], signal.SIGKILL)
    return killed_at


def _longest_gap(bootstrap: str, topic: str, since: float) -> float:
    """The longest silence between two consecutive results on one partition of ``topic``
    from a second before ``since`` on (every partition: the killed child's are the longest)."""
    times = asyncio.run(_result_times(bootstrap, topic))
    gaps = []
    for stamps in times.values():
        after = [t for t in sorted(stamps) if t >= since - 1.0]
        gaps.append(max((b - a for a, b in itertools.pairwise(after)), default=0.0))
    return max(gaps)


def _run(
    bootstrap: str, cli_env: dict[str, str], tmp_path: Path, workload: Workload, *, static: bool
) -> tuple[float, RunOutputs, str]:
    """One run with a kill -9 of child 2 mid-stream: (its partitions' longest gap, outputs, log).
    Every record each stage consumed has its outcome (the outcome audit), across the kill."""
    topo = workload.topology(tmp_path)
    with _supervised(topo, _env(cli_env, bootstrap, static=static), tmp_path / "supervisor.log") as (sup, ports):
        producer = workload.producing(bootstrap, topo, seconds=PRODUCE_S)
        killed_at = _kill_once_both_serve(sup, ports)
        producer.join(timeout=120)
        assert workload.done(collect_outputs(bootstrap, topo, workload.done, timeout=120).records), "not finished"
        assert sup.terminate(timeout=60) == 0, sup.log()
    audit = audit_outcomes(bootstrap, topo.path)
    assert not audit.problems(), f"{workload.kind}: " + "; ".join(audit.problems())
    gap = _longest_gap(bootstrap, topo.result_topic, killed_at)
    return gap, RunOutputs.read(bootstrap, topo, workload.identity), sup.log()


def _report(workload: Workload, out: RunOutputs, gap: float, *, static: bool) -> None:
    report(FaultFigures(
        scenario=f"kill -9 of a child, {'static' if static else 'dynamic'} membership, Apache Kafka",
        topology=workload.kind, sent=len(workload.records), results=len(out.results), duplicates=out.duplicates(),
        exact_duplicates=not out.inexact(), dead_letters=len(out.dead_letters), lost=0, recovery_s=gap,
        note=f"session timeout {SESSION_MS / 1000:g} s; longest gap on a partition after the kill {gap:.1f} s",
    ))  # fmt: skip


def test_a_killed_static_member_is_back_in_seconds_and_a_dynamic_one_waits_for_its_session(
    apache_kafka: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    results = {}
    workload = stateless(N, 211)
    for static in (False, True):
        (tmp_path / str(static)).mkdir()
        gap, out, log = _run(apache_kafka, cli_env, tmp_path / str(static), workload, static=static)
        assert "exited with -9" in log, log
        assert out.dead_letters == [], out.dead_letters[:3]
        assert set(out.results) == {f"sl-{i}".encode() for i in range(N)}, "lost requests"
        assert out.inexact() == [], "a duplicate differs from its first delivery"
        results[static] = (gap, out.duplicates())
        _report(workload, out, gap, static=static)
    dynamic_gap, static_gap = results[False][0], results[True][0]
    assert static_gap <= STATIC_GAP_BOUND_S, (
        f"static: {static_gap:.1f} s from the kill to results again (dynamic {dynamic_gap:.1f} s)"
    )
    assert dynamic_gap > static_gap, f"dynamic {dynamic_gap:.1f} s, static {static_gap:.1f} s"


@pytest.mark.parametrize("make", [audio, ensemble], ids=["audio", "ensemble"])
def test_a_killed_static_member_of_a_stateful_topology_is_back_in_seconds(
    apache_kafka: str, cli_env: dict[str, str], tmp_path: Path, make: Callable[[], Workload]
) -> None:
    """The sequence stage (audio: DALI, then Silero VAD) and the join (ensemble: two branches
    and a result join) restore their state from their changelogs after the kill; the warm
    standby comes back under the killed child's name, so the broker hands it the same
    partitions and that state is the one it had. (Their dynamic-membership gap, like the
    stateless one, is the session timeout: measured once, in docs/faults.md.)"""
    workload = make()
    gap, out, log = _run(apache_kafka, cli_env, tmp_path, workload, static=True)
    assert "exited with -9" in log, log
    assert out.dead_letters == [], out.dead_letters[:3]
    assert out.inexact() == [], "a duplicate differs from its first delivery"
    _report(workload, out, gap, static=True)
    assert gap <= STATIC_GAP_BOUND_S, f"{workload.kind}: {gap:.1f} s from the kill to results again"


CALLS = 600
CALLS_IN_FLIGHT = 64
CALL_TIMEOUT_S = 10.0
CALLS_PER_S = 30.0


def test_600_client_calls_through_a_kill_9_are_all_answered_in_time_and_only_once(
    apache_kafka: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 26's user-level scenario: a program calls topologies/dense.yaml's model through
    the public client, 600 calls over 20 s with up to 64 in flight, each with a 10 s timeout
    (its deadline). One child of ``--processes 2`` is killed with SIGKILL mid-run. With
    static membership every call is answered in time, correctly, and no request gets a dead
    letter besides its result (a replay of an answered request, past its deadline, would
    have given one: issue 26's second finding)."""
    features = random_features(CALLS, 311).reshape(CALLS, 1, 16)
    topo = stateless(1).topology(tmp_path)
    env = _env(cli_env, apache_kafka, static=True)

    async def calls() -> list[InferResult | ClientError]:
        async def paced() -> AsyncIterator[dict[str, np.ndarray]]:
            for row in features:
                yield {"features": row}
                await asyncio.sleep(1 / CALLS_PER_S)

        async with Client(topo.path, kafka=KafkaSettings(bootstrap_servers=apache_kafka), timeout=CALL_TIMEOUT_S) as c:
            answers = [a async for a in c.infer_many(paced(), max_in_flight=CALLS_IN_FLIGHT, return_exceptions=True)]
            assert c.stats.late == 0, c.stats
            return answers

    started = time.time()
    with _supervised(topo, env, tmp_path / "supervisor.log") as (supervisor, ports), ThreadPoolExecutor(1) as pool:
        kill = pool.submit(_kill_once_both_serve, supervisor, ports)
        answers = asyncio.run(calls())
        killed_at = kill.result(timeout=60)
        assert supervisor.terminate(timeout=60) == 0, supervisor.log()
    failed = [a for a in answers if isinstance(a, ClientError)]
    assert not failed, f"{len(failed)} of {CALLS} calls failed, e.g. {failed[:3]}"
    for i, answer in enumerate(answers):
        assert isinstance(answer, InferResult)
        np.testing.assert_allclose(answer.outputs["logits"], mlp_reference(features[i]), rtol=1e-4, atol=1e-5)
    dead = asyncio.run(collect(apache_kafka, [topo.dead_letter_topic], done=lambda _records: False, timeout=3))
    assert dead.records == [], f"{len(dead.records)} dead letters beside the results"
    print(
        f"\n{CALLS} client calls, {CALLS_IN_FLIGHT} in flight, {CALL_TIMEOUT_S:g} s timeout, a child killed "
        f"{killed_at - started:.0f} s after the start: {len(answers)} answered, 0 timed out, 0 dead letters"
    )


def test_a_static_member_stopped_for_good_hands_its_partitions_on_at_once(
    apache_kafka: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """A scale-down: two workers of one stage with stable names; one gets SIGTERM and does not
    come back. A clean stop leaves the group (KIP-345's member removal, LeaveGroup v3 with
    its instance ID), so the broker moves its partitions at once, well inside the session
    timeout: the stayer serves them from then on, with nothing lost. (A kill leaves nothing:
    that is the restart static membership is for, above.)"""
    workload = stateless(N, 212)
    topo = workload.topology(tmp_path)
    name = f"static-{uuid.uuid4().hex[:6]}"
    base = _env(cli_env, apache_kafka, static=False)
    workers = [
        PipelineProcess(topo, dict(base, PIPELINE_KAFKA_GROUP_INSTANCE_ID=f"{name}-{i}"), tmp_path / f"w{i}.log")
        for i in range(2)
    ]
    try:
        for worker in workers:
            worker.start()
        producer = workload.producing(apache_kafka, topo, seconds=PRODUCE_S)
        wait_until(
            lambda: all(w.metric("pipeline_results_total") > 0 for w in workers), "results from both", workers[0]
        )
        time.sleep(2.0)
        stopped_at = time.time()
        assert workers[1].terminate() == 0, workers[1].log()
        producer.join(timeout=120)
        collect_outputs(apache_kafka, topo, workload.done, timeout=120)
        assert workers[0].terminate() == 0, workers[0].log()
    finally:
        for worker in workers:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.kill()
    out = RunOutputs.read(apache_kafka, topo, workload.identity)
    gap = _longest_gap(apache_kafka, topo.result_topic, stopped_at)
    assert out.dead_letters == [], out.dead_letters[:3]
    assert set(out.results) == {f"sl-{i}".encode() for i in range(N)}, "lost requests"
    assert out.inexact() == [], "a duplicate differs from its first delivery"
    report(FaultFigures(
        scenario="SIGTERM of a static member that does not come back, Apache Kafka", topology=workload.kind,
        sent=N, results=len(out.results), duplicates=out.duplicates(), exact_duplicates=True, dead_letters=0, lost=0,
        recovery_s=gap, note=f"session timeout {SESSION_MS / 1000:g} s; its partitions silent for {gap:.1f} s",
    ))  # fmt: skip
    assert gap <= SCALE_DOWN_REBALANCE_S < SESSION_MS / 1000, f"{gap:.1f} s until the stayer took over"
