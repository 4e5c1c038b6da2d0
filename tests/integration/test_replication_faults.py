"""Issue 23's replication faults, on a three-broker Apache Kafka cluster of this module's own.

Every run's topics have three replicas and ``min.insync.replicas=2``; the stages produce with
``acks=all`` and idempotence (``PIPELINE_KAFKA_IDEMPOTENCE=true``), and so do the test's
producers of requests (tests/helpers/kafka_cluster_faults.py). The stateless, audio (DALI +
sequence) and ensemble (fan-out + join) topologies (tests/helpers/fault_workloads.py) run side
by side through each fault, as three deployments on one cluster would, and each one's outputs
are compared with a fault-free reference run of the same records on the same cluster
(tests/helpers/fault_compare.py): nothing lost, extra, changed or reordered, every duplicate
byte-identical to its first delivery, no dead letter the reference lacks. Each reports its
figures (tests/helpers/figures.py, printed in the run's "fault figures"): recovery is from the
fault's end to the first result after it, and the note gives the longest time without a
result that began during the fault.

- kill -9 of the leader of the busiest partition (the one that took the most records over a
  second, across every run's topics), under load: the controller fences it after the broker
  session timeout and the in-sync followers lead its partitions; the fault ends when the
  busiest partition has its new leader. The killed broker is started again meanwhile, as a
  supervisor would, and rejoins as a follower.
- SIGSTOP of that partition's leader for longer than the broker session timeout (connections
  open, nothing answered: fenced, its partitions led elsewhere), then SIGCONT: it finds itself
  fenced, truncates what no follower took, and catches up. The fault ends at SIGCONT.
- a rolling restart: each broker in turn stopped (SIGTERM) and started again, the next one
  only once the restarted broker has rejoined and every replica is back in sync. The fault
  ends when the last broker is back in sync.

Workers run supervised (tests/helpers/supervisor.py): a stage Kafka fails for longer than it
can wait stops in one line and is started again; how many did is in each row's note.

What it showed (3 runs of 3, 2026-11-28, 2 cores shared with another test run; 140-149 s for
the module): 0 lost, at most 4 duplicates per topology (all exact), no dead letter and no
worker exit. A leader's loss costs about the broker session timeout (9 s, KRaft's default,
which the embedded cluster keeps): after a kill -9 the new leader came 8.9-11.2 s later and
every topology stood still 9.0-12.2 s (the note's longest pause); frozen, the broker's
partitions moved after 9.8-13.2 s and the topologies stood still 7-19 s. A rolling restart
pauses them 9-11 s at each broker: the embedded cluster sets ``controlled.shutdown.enable=false``,
so a broker stopped with SIGTERM hands over none of its partitions and they move only when the
controller fences it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.settings import S3Settings, TritonSettings
from tests.helpers.fault_compare import RunOutputs
from tests.helpers.fault_workloads import Run, Workload, audio, ensemble, finish_all, judge, stateless
from tests.helpers.kafka_cluster_faults import Cluster, longest_pause_s, now_ms, run_topics, start_cluster
from tests.helpers.supervisor import Supervisor

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow, pytest.mark.exclusive]  # measures time: alone

HELD_BACK = 20
"""Records of the stateless and ensemble runs sent only once the fault is over (the audio
streams' tails cannot wait), so each shows a result after it however long it took."""
FROZEN_PAST_SESSION_S = 3.0
"""How much longer than the broker session timeout a broker stays frozen."""


@pytest.fixture(scope="module", autouse=True)
def module_clock() -> Iterator[None]:
    """Prints the module's wall time (from its first module fixture; the session's S3 and
    Triton, when this module starts them, come before it)."""
    started = time.monotonic()
    yield
    print(f"\nreplication faults module: {time.monotonic() - started:.0f} s")


@pytest.fixture(scope="module")
def cluster(
    s3_settings: S3Settings, triton_settings: TritonSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    log_dir, state_dir = tmp_path_factory.mktemp("cluster-logs"), tmp_path_factory.mktemp("cluster-state")
    with start_cluster(s3_settings, triton_settings, log_dir, state_dir) as started:
        yield started


@pytest.fixture(scope="module")
def workloads() -> dict[str, Workload]:
    return {w.kind: w for w in (stateless(), audio(), ensemble())}


@pytest.fixture(scope="module")
def references(
    workloads: dict[str, Workload], cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, RunOutputs]:
    return cluster.references(list(workloads.values()), tmp_path_factory.mktemp("references"))


@pytest.fixture
def whole(cluster: Cluster) -> Cluster:
    """The cluster with every broker up and every replica in sync, whatever the test before left."""
    cluster.heal()
    return cluster


def _release(runs: list[Run]) -> None:
    """The fault is over: the records held back go out now."""
    for run in runs:
        run.release.set()


def _exits(supervisor: Supervisor, kind: str) -> str:
    return f"worker exits {[e.code for e in supervisor.exits[kind]]}"


def _check_exits(supervisor: Supervisor) -> None:
    for kind, seen in supervisor.exits.items():
        for exit in seen:  # only ever the one-line stop of a stage Kafka failed
            assert exit.code == 1 and "Kafka failed it" in exit.last_line, f"{kind}: {exit}"


# ------------------------------------------------------------------ (a) leader kill -9


def test_leader_of_the_busiest_partition_killed(
    workloads: dict[str, Workload], references: dict[str, RunOutputs], whole: Cluster, tmp_path: Path
) -> None:
    cluster = whole
    runs = cluster.producing_runs(list(workloads.values()), tmp_path, seconds=15, held_back=HELD_BACK)
    supervisor = Supervisor(runs)
    supervisor.start()
    partition, rate = cluster.busiest(run_topics(runs, cluster.env))
    leader = cluster.leader(partition)
    killed_ms = now_ms()
    cluster.process(leader).kill()
    failover_s = cluster.wait_led_elsewhere(partition, leader)
    fault_end_ms = now_ms()
    _release(runs)
    # Started again as a supervisor would, while the runs go on: it rejoins as a follower.
    # From this thread: a broker dies with the thread that started it (PR_SET_PDEATHSIG).
    began = time.monotonic()
    cluster.process(leader).start()
    in_sync_s = cluster.wait_in_sync() + time.monotonic() - began
    supervisor.until_done(cluster.bootstrap)
    outputs = finish_all(runs, cluster.bootstrap)
    notes = {
        kind: f"killed broker {leader}, leader of {partition.topic}-{partition.partition} ({rate:.0f} records/s); "
        f"new leader after {failover_s:.1f} s; longest pause {longest_pause_s(out, killed_ms, fault_end_ms):.1f} s; "
        f"restarted, in sync {in_sync_s:.1f} s later; {_exits(supervisor, kind)}"
        for kind, out in outputs.items()
    }
    judge("replication: leader kill -9", outputs, references, workloads, fault_end_ms, notes=notes)
    _check_exits(supervisor)


# ------------------------------------------------------------------ (b) leader frozen past its session


def test_broker_frozen_past_its_session_timeout(
    workloads: dict[str, Workload], references: dict[str, RunOutputs], whole: Cluster, tmp_path: Path
) -> None:
    cluster = whole
    session_s = cluster.session_timeout_s()
    frozen_s = session_s + FROZEN_PAST_SESSION_S
    runs = cluster.producing_runs(list(workloads.values()), tmp_path, seconds=20, held_back=HELD_BACK)
    supervisor = Supervisor(runs)
    supervisor.start()
    partition, rate = cluster.busiest(run_topics(runs, cluster.env))
    leader = cluster.leader(partition)
    broker = cluster.process(leader)
    frozen_ms = now_ms()
    broker.pause()
    try:
        fenced_s = cluster.wait_led_elsewhere(partition, leader, timeout=frozen_s + 30)
        time.sleep(max(0.0, frozen_s - (now_ms() - frozen_ms) / 1000))
    finally:
        broker.resume()
    fault_end_ms = now_ms()
    _release(runs)
    supervisor.until_done(cluster.bootstrap)
    outputs = finish_all(runs, cluster.bootstrap)
    in_sync_s = cluster.wait_in_sync()
    notes = {
        kind: f"froze broker {leader}, leader of {partition.topic}-{partition.partition} ({rate:.0f} records/s), "
        f"{frozen_s:g} s (session {session_s:g} s); led elsewhere after {fenced_s:.1f} s; "
        f"longest pause {longest_pause_s(out, frozen_ms, fault_end_ms):.1f} s; {_exits(supervisor, kind)}"
        for kind, out in outputs.items()
    }
    judge("replication: broker SIGSTOP past session", outputs, references, workloads, fault_end_ms, notes=notes)
    _check_exits(supervisor)
    print(f"\nfrozen broker {leader} back in sync {in_sync_s:.1f} s after the runs finished")


# ------------------------------------------------------------------ (c) rolling restart


def test_rolling_restart_of_every_broker(
    workloads: dict[str, Workload], references: dict[str, RunOutputs], whole: Cluster, tmp_path: Path
) -> None:
    cluster = whole
    runs = cluster.producing_runs(list(workloads.values()), tmp_path, seconds=45, held_back=HELD_BACK)
    supervisor = Supervisor(runs)
    supervisor.start()
    started_ms = now_ms()
    steps = []
    for node_id in cluster.node_ids:
        began = time.monotonic()
        broker = cluster.process(node_id)
        broker.stop()  # SIGTERM: a clean stop (not a controlled shutdown: the embedded cluster has none)
        stopped = time.monotonic() - began
        broker.start()  # returns once it has registered again and answers
        answering = time.monotonic() - began
        in_sync = cluster.wait_in_sync() + answering
        steps.append(f"{node_id}: stopped {stopped:.1f} s, answering {answering:.1f} s, in sync {in_sync:.1f} s")
    fault_end_ms = now_ms()
    _release(runs)
    supervisor.until_done(cluster.bootstrap)
    outputs = finish_all(runs, cluster.bootstrap)
    notes = {
        kind: f"brokers {'; '.join(steps)}; longest pause {longest_pause_s(out, started_ms, fault_end_ms):.1f} s; "
        f"{_exits(supervisor, kind)}"
        for kind, out in outputs.items()
    }
    judge("replication: rolling restart", outputs, references, workloads, fault_end_ms, notes=notes)
    _check_exits(supervisor)
