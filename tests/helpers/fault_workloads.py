"""The three topologies of the fault campaign, each with a fixed set of records to send.

A fault test runs one of these twice, fault-free and faulted, on private topologies with
the same records, and compares the outputs (:mod:`tests.helpers.fault_compare`):

- ``stateless``: one dense_classifier stage, one request per correlation ID;
- ``audio``: topologies/audio.yaml's stages (DALI preprocessing, then the Silero sequence
  stage), a few interleaved audio streams;
- ``ensemble``: topologies/ensemble.yaml (normalise, two parallel branches, a result join).

Every Triton-calling stage gets a short ``call_timeout_s`` and fast retries, so a fault
is noticed in seconds and recovery is not hidden behind a long backoff.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.contract.records import Record
from pipeline.contract.request import encode_request
from tests.helpers.dense_reference import random_features
from tests.helpers.fault_compare import Identity, Rec, RunOutputs, by_key, by_stream_result, compare, recovery_s
from tests.helpers.figures import report
from tests.helpers.kafka_io import header, produce
from tests.helpers.outcome_audit import audit_outcomes
from tests.helpers.streams import AUDIO_STAGES, interleave, stream_records, utterance
from tests.helpers.topology_process import (
    ENSEMBLE_YAML,
    PipelineProcess,
    TopologyFiles,
    collect_outputs,
    write_topology,
)

CALL_TIMEOUT_S = 2.0
FAST_FAILURES: dict[str, Any] = {
    "call_timeout_s": CALL_TIMEOUT_S,
    "retry": {"initial_backoff_ms": 50.0, "max_backoff_ms": 1000.0},
}
"""For every stage that calls Triton: a hung call ends in 2 s; waits are at most 1 s."""

TopologyFactory = Callable[[Path, dict[str, Any]], TopologyFiles]


@dataclass(frozen=True)
class Workload:
    """What one topology is sent, how its results are identified, and when it is done."""

    kind: str
    records: list[Record]
    identity: Identity
    done: Callable[[list[Rec]], bool]
    make_topology: TopologyFactory
    models: tuple[str, ...]
    """The Triton models its stages call."""
    burst: bool = False
    """Sent at once, its records are stamped as one burst (``kafka_io.produce``): event time
    then does not stretch with a busy machine's sending."""
    tail_can_wait: bool = True
    """Its last records may be sent late without changing a result (each is its own request).
    Not so for audio: a stream whose last chunks come over 10 s late is closed as idle."""

    def topology(self, tmp_path: Path, **extra: Any) -> TopologyFiles:
        """A private topology (unique topics and groups); ``extra``: topology-level settings."""
        return self.make_topology(tmp_path, extra)

    def producing(
        self,
        bootstrap: str,
        topology: TopologyFiles,
        *,
        seconds: float,
        held_back: int = 0,
        release: threading.Event | None = None,
    ) -> threading.Thread:
        """Send the records evenly over ``seconds`` (0: at once) from a thread; the last
        ``held_back`` of them only once ``release`` is set (at once then)."""
        held = held_back if release is not None and self.tail_can_wait else 0
        records, tail = self.records[: len(self.records) - held], self.records[len(self.records) - held :]
        rate = len(records) / seconds if seconds > 0 else 0.0

        def send() -> None:
            asyncio.run(produce(bootstrap, topology.input_topic, records, rate=rate, burst=self.burst and rate == 0))
            if tail and release is not None and release.wait(timeout=600):
                asyncio.run(produce(bootstrap, topology.input_topic, tail))

        thread = threading.Thread(target=send, name=f"produce-{self.kind}")
        thread.start()
        return thread


def _tuned(stage: dict[str, Any]) -> dict[str, Any]:
    return {**stage, **FAST_FAILURES} if stage["kind"] in ("stateless", "sequence") else dict(stage)


def _distinct_keys(n: int) -> Callable[[list[Rec]], bool]:
    return lambda records: len({r.key for r in records}) >= n


def stateless(n: int = 400, seed: int = 101) -> Workload:
    features = random_features(n, seed)
    records = [encode_request({"features": features[i : i + 1]}, correlation_id=f"sl-{i}") for i in range(n)]
    stage = _tuned({"name": "classify", "kind": "stateless", "model": "dense_classifier"})
    stage["batching"] = {"max_queue_delay_ms": 5.0, "max_inflight_batches": 4}

    def make(tmp_path: Path, extra: dict[str, Any]) -> TopologyFiles:
        return write_topology(tmp_path, partitions=2, stages=[stage], extra=extra)

    return Workload("stateless", records, by_key, _distinct_keys(n), make, ("dense_classifier",))


def audio(streams: int = 4) -> Workload:
    keys = [f"audio-{i:02d}" for i in range(streams)]
    records = interleave([stream_records(key, utterance(i % 3)) for i, key in enumerate(keys)])
    stages = [_tuned(stage) for stage in AUDIO_STAGES]

    def done(results: list[Rec]) -> bool:
        return {r.key.decode() for r in results if header(r, "result-type") == "summary"} >= set(keys)

    def make(tmp_path: Path, extra: dict[str, Any]) -> TopologyFiles:
        return write_topology(tmp_path, partitions=2, stages=stages, extra=extra)

    return Workload("audio", records, by_stream_result, done, make, ("silero_vad",), tail_can_wait=False)


def ensemble(n: int = 400, seed: int = 102, window_ms: float = 5000.0) -> Workload:
    raw = random_features(n, seed)
    records = [encode_request({"raw": raw[i : i + 1]}, correlation_id=f"ens-{i}") for i in range(n)]
    doc = yaml.safe_load(ENSEMBLE_YAML.read_text())
    stages = [_tuned(stage) for stage in doc["stages"]]
    graph = {
        "inputs": doc["inputs"],
        "outputs": doc["outputs"],
        "result_join": {"mode": "inner", "window_ms": window_ms},
    }

    def make(tmp_path: Path, extra: dict[str, Any]) -> TopologyFiles:
        return write_topology(tmp_path, partitions=2, stages=stages, extra={**graph, **extra})

    models = tuple(stage["model"] for stage in doc["stages"])
    return Workload("ensemble", records, by_key, _distinct_keys(n), make, models)


@dataclass
class Run:
    """One workload on its own private topology, with the worker process serving it."""

    workload: Workload
    topology: TopologyFiles
    env: dict[str, str]
    logs: Path
    worker: PipelineProcess
    producer: threading.Thread | None = None
    release: threading.Event = field(default_factory=threading.Event)
    """Set by :meth:`finish`: the records held back by :meth:`produce` go out then, after the
    fault, so a run whose records are all answered during a long fault still shows recovery."""

    def new_worker(self, env: dict[str, str] | None = None) -> PipelineProcess:
        """Another `pipeline run` of the same topology (same groups: it takes over)."""
        log = self.logs / f"{self.workload.kind}-{uuid.uuid4().hex[:6]}.log"
        self.worker = PipelineProcess(self.topology, env or self.env, log)
        return self.worker

    def new_worker_beside(self) -> PipelineProcess:
        """Another `pipeline run` of the same topology that shares the work with :attr:`worker`."""
        return PipelineProcess(self.topology, self.env, self.logs / f"{self.workload.kind}-{uuid.uuid4().hex[:6]}.log")

    def produce(self, bootstrap: str, *, seconds: float, held_back: int = 0) -> None:
        self.producer = self.workload.producing(
            bootstrap, self.topology, seconds=seconds, held_back=held_back, release=self.release
        )

    def finish(self, bootstrap: str, timeout: float = 180.0) -> RunOutputs:
        """Wait for the producer and for every result, stop the worker cleanly (exit code 0),
        audit that every record each stage consumed has an outcome (across every restart:
        :mod:`tests.helpers.outcome_audit`), then read all outputs to the end."""
        self.release.set()
        if self.producer is not None:
            self.producer.join(timeout=timeout)
        collected = collect_outputs(bootstrap, self.topology, self.workload.done, timeout=timeout)
        code = self.worker.terminate()
        assert code == 0, f"{self.workload.kind}: exit code {code}\n{self.worker.log()}"
        audit = audit_outcomes(bootstrap, self.topology.path)
        finished = self.workload.done(collected.records)
        print(
            f"\noutcome audit [{self.workload.kind}]: {audit.line()}"
            + ("" if finished else f" (not finished in {timeout:g} s)")
        )
        # A run stopped before it finished left records for a next owner: the comparison names them.
        assert not finished or not audit.problems(), f"{self.workload.kind}: " + "; ".join(audit.problems())
        return RunOutputs.read(bootstrap, self.topology, self.workload.identity)


def start_runs(workloads: Sequence[Workload], env: dict[str, str], tmp_path: Path, **extra: Any) -> list[Run]:
    """A private topology and a ready worker for each workload (started side by side)."""
    runs = []
    for workload in workloads:
        topology = workload.topology(tmp_path, **extra)
        log = tmp_path / f"{workload.kind}-first.log"
        runs.append(Run(workload, topology, env, tmp_path, PipelineProcess(topology, env, log)))
    start_workers([run.worker for run in runs])
    return runs


def start_workers(workers: Sequence[PipelineProcess]) -> None:
    """Start the processes side by side, each until it is ready."""
    with ThreadPoolExecutor(len(workers)) as pool:
        list(pool.map(lambda worker: worker.start(), workers))


def producing_runs(
    workloads: Sequence[Workload],
    env: dict[str, str],
    tmp_path: Path,
    bootstrap: str,
    *,
    seconds: float,
    held_back: int = 0,
    **extra: Any,
) -> list[Run]:
    """:func:`start_runs`, each sending its records over ``seconds``, returned once every
    worker has produced some results: a fault applied now hits mid-stream. ``held_back``:
    records of each workload whose tail can wait sent only by :meth:`Run.finish`."""
    runs = start_runs(workloads, env, tmp_path, **extra)
    for run in runs:
        run.produce(bootstrap, seconds=seconds, held_back=held_back)
    wait_for_results(runs, 40)
    return runs


def finish_all(runs: Sequence[Run], bootstrap: str) -> dict[str, RunOutputs]:
    return {run.workload.kind: run.finish(bootstrap) for run in runs}


def reference_outputs(
    workloads: Sequence[Workload], bootstrap: str, env: dict[str, str], tmp_path: Path
) -> dict[str, RunOutputs]:
    """Each workload once without a fault, all side by side: complete, with neither dead
    letters nor duplicates (what every faulted run is compared with)."""
    runs = start_runs(workloads, env, tmp_path)
    for run in runs:
        run.produce(bootstrap, seconds=0)
    return checked_references(runs, finish_all(runs, bootstrap))


def checked_references(runs: Sequence[Run], outputs: dict[str, RunOutputs]) -> dict[str, RunOutputs]:
    """``outputs`` of fault-free runs, checked to be fit to compare with: complete, with
    neither dead letters nor duplicates."""
    for run in runs:
        out = outputs[run.workload.kind]
        assert run.workload.done([r for records in out.results.values() for r in records]), run.workload.kind
        assert out.dead_letters == [], f"{run.workload.kind}: {len(out.dead_letters)} dead letters"
        assert out.duplicates() == 0, f"{run.workload.kind}: a fault-free run has no duplicates"
    return outputs


def judge(
    scenario: str,
    outputs: dict[str, RunOutputs],
    references: dict[str, RunOutputs],
    workloads: dict[str, Workload],
    fault_end_ms: int,
    *,
    notes: dict[str, str] | None = None,
    expected_dead: Callable[[Rec], bool] = lambda _record: False,
) -> None:
    """Report every topology's figures (recovery: from ``fault_end_ms`` to the first result
    after it), then fail naming each topology that broke a rule: anything but exact
    duplicates compared with its reference, or no result after the fault."""
    failures = []
    for kind, out in outputs.items():
        comparison = compare(references[kind], out, sent=len(workloads[kind].records), expected_dead=expected_dead)
        recovered = recovery_s(out, fault_end_ms)
        report(comparison.figures(scenario, kind, recovery_s=recovered, note=(notes or {}).get(kind, "")))
        problems = comparison.problems() + ([] if recovered is not None else ["no result after the fault ended"])
        failures += [f"{kind}: {problem}" for problem in problems]
    assert not failures, "\n".join(failures)


def wait_for_results(runs: Sequence[Run], at_least: int, timeout: float = 90.0) -> None:
    """Until every run's worker has produced ``at_least`` results (so a fault hits mid-stream)."""
    deadline = time.monotonic() + timeout
    for run in runs:
        while run.worker.metric("pipeline_results_total") < at_least:
            assert time.monotonic() < deadline, f"{run.workload.kind}: no progress\n{run.worker.log()}"
            time.sleep(0.1)
