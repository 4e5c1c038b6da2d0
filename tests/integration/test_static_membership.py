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
import itertools
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from pipeline.embedded.stack import EmbeddedStack
from pipeline.errors import PipelineError
from tests.helpers.fault_compare import RunOutputs, by_key
from tests.helpers.fault_workloads import stateless
from tests.helpers.figures import FaultFigures, report
from tests.helpers.topology_process import PipelineProcess, collect_outputs, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow, pytest.mark.exclusive]  # measures a gap

N = 3_000
PRODUCE_S = 20.0
SESSION_MS = 10_000
STATIC_GAP_BOUND_S = 3.0
"""Issue 26's bound. Measured alone on the 2-core machine (2026-11-27): 2.9 s twice while the
supervisor started a fresh child (2.2-2.7 s of its start-up, most of it imports); 0.4 s once
the warm standby replaces it (imported, topology loaded: the join and the stage's setup are
what is left)."""


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


def _run(bootstrap: str, cli_env: dict[str, str], tmp_path: Path, *, static: bool) -> tuple[float, RunOutputs, str]:
    """One run with a kill -9 of child 2 mid-stream: (its partitions' longest gap, outputs, log)."""
    workload = stateless(N, 211)
    topo = workload.topology(tmp_path)
    env = dict(cli_env, PIPELINE_KAFKA_BOOTSTRAP_SERVERS=bootstrap, PIPELINE_KAFKA_SESSION_TIMEOUT_MS=str(SESSION_MS))
    env.pop("PIPELINE_KAFKA_GROUP_INSTANCE_ID", None)
    if static:
        env["PIPELINE_KAFKA_GROUP_INSTANCE_ID"] = f"static-{uuid.uuid4().hex[:6]}"
    supervisor = PipelineProcess(topo, env, tmp_path / "supervisor.log", args=["--processes", "2"]).start()
    ports = [supervisor.http_port, supervisor.http_port + 1]
    try:
        wait_until(
            lambda: all(supervisor.get("/readyz", p)[0] == 200 for p in ports),
            "both children ready",
            supervisor,
            timeout=90.0,
        )
        producer = workload.producing(bootstrap, topo, seconds=PRODUCE_S)
        wait_until(
            lambda: all(supervisor.metric("pipeline_results_total", p) > 0 for p in ports),
            "results from both",
            supervisor,
            timeout=90.0,
        )
        time.sleep(2.0)  # a steady stream on both children's partitions before the kill
        victim = supervisor.children()[ports[1]]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        producer.join(timeout=120)
        collect_outputs(bootstrap, topo, workload.done, timeout=120)
        assert supervisor.terminate(timeout=60) == 0, supervisor.log()
    finally:
        if supervisor.proc is not None and supervisor.proc.poll() is None:
            supervisor.kill()
    times = asyncio.run(_result_times(bootstrap, topo.result_topic))
    gaps = []
    for stamps in times.values():
        after = [t for t in sorted(stamps) if t >= killed_at - 1.0]
        gaps.append(max((b - a for a, b in itertools.pairwise(after)), default=0.0))
    return max(gaps), RunOutputs.read(bootstrap, topo, by_key), supervisor.log()


def test_a_killed_static_member_is_back_in_seconds_and_a_dynamic_one_waits_for_its_session(
    apache_kafka: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    results = {}
    for static in (False, True):
        (tmp_path / str(static)).mkdir()
        gap, out, log = _run(apache_kafka, cli_env, tmp_path / str(static), static=static)
        assert "exited with -9" in log, log
        assert out.dead_letters == [], out.dead_letters[:3]
        assert set(out.results) == {f"sl-{i}".encode() for i in range(N)}, "lost requests"
        assert out.inexact() == [], "a duplicate differs from its first delivery"
        results[static] = (gap, out.duplicates())
        report(FaultFigures(
            scenario=f"kill -9 of a child, {'static' if static else 'dynamic'} membership, Apache Kafka",
            topology="stateless", sent=N, results=len(out.results), duplicates=out.duplicates(),
            exact_duplicates=True, dead_letters=0, lost=0, recovery_s=gap,
            note=f"session timeout {SESSION_MS / 1000:g} s; longest gap on a partition after the kill {gap:.1f} s",
        ))  # fmt: skip
    dynamic_gap, static_gap = results[False][0], results[True][0]
    assert static_gap <= STATIC_GAP_BOUND_S, (
        f"static: {static_gap:.1f} s from the kill to results again (dynamic {dynamic_gap:.1f} s)"
    )
    assert dynamic_gap > static_gap, f"dynamic {dynamic_gap:.1f} s, static {static_gap:.1f} s"
