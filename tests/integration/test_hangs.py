"""Nothing wedges: a hung Triton (SIGSTOP) makes a stage not-ready, then it recovers, and
SIGTERM during the hang exits within its bound, leaving unfinished work to be replayed.

Each test stops a Triton of its own (``own_triton``), never the session's, and runs
`pipeline run` as a real subprocess on a private topology with short timeouts, so
a hang is noticed in seconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord

from pipeline.contract.records import Record
from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from tests.helpers import streams as st
from tests.helpers import topology_process as tp
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.kafka_io import Collected, header, produce
from tests.helpers.own_triton import OwnTriton

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow, pytest.mark.exclusive]  # measures time: alone

CALL_TIMEOUT_S = 1.0
STALL_AFTER_S = 2.0
# Fast retries, so recovery after SIGCONT is quick (an outage waits without counting attempts).
STAGE = {
    "call_timeout_s": CALL_TIMEOUT_S,
    "stall_after_s": STALL_AFTER_S,
    "retry": {"initial_backoff_ms": 50.0, "max_backoff_ms": 500.0},
    "batching": {"max_queue_delay_ms": 5.0, "max_inflight_batches": 4, "max_pending_requests": 1000},
}


@contextmanager
def hung(triton: OwnTriton) -> Iterator[None]:
    """Triton and its backend stubs stopped (SIGSTOP to its process group); always resumed."""
    pid = triton.process.pid
    assert pid is not None and triton.process.running()
    os.killpg(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(pid, signal.SIGCONT)


def _ready_again(worker: tp.PipelineProcess, triton: OwnTriton, timeout: float) -> float:
    """Seconds until ``/readyz`` answers 200 after the hang.

    Triton 2.51's Python backend sometimes does not survive a long freeze of its process
    group: a segmentation fault in ``libtriton_python.so`` (then ``boost::interprocess::
    lock_exception``) as it resumes, seen in 2 of about 8 runs of the sequence test. For the
    worker that is only a longer outage, so the test starts Triton again on the same ports,
    as an operator's supervisor would, and the worker must still lose nothing."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if _readyz(worker)[0] == 200:
            return time.monotonic() - started
        if not triton.process.running():
            print(f"\nTriton died after the hang (log: {triton.process.log_path}); started again")
            triton.heal()
        time.sleep(0.1)
    raise AssertionError(f"/readyz not 200 after {timeout}s:\n{worker.log()}")


def _requests(n: int, seed: int, prefix: str) -> tuple[list[Record], np.ndarray]:
    features = random_features(n, seed)
    records = [encode_request({"features": features[i : i + 1]}, correlation_id=f"{prefix}-{i}") for i in range(n)]
    return records, features


def _outcomes(
    out: Collected, topo: tp.TopologyFiles, features: np.ndarray, prefix: str
) -> tuple[list[ConsumerRecord[bytes, bytes]], Counter[str]]:
    """The dead letters, and the results per correlation ID, each checked against the numpy reference."""
    counts: Counter[str] = Counter()
    for record in out.on(topo.result_topic):
        response = decode_response(record.value, record.headers)
        index = int(response.correlation_id.removeprefix(f"{prefix}-"))
        np.testing.assert_allclose(
            response.outputs["logits"], mlp_reference(features[index : index + 1]), rtol=1e-4, atol=1e-5
        )
        counts[response.correlation_id] += 1
    return out.on(topo.dead_letter_topic), counts


def _assert_each_answered_once(
    dead: list[ConsumerRecord[bytes, bytes]], counts: Counter[str], prefix: str, n: int
) -> None:
    assert dead == [], [r.headers for r in dead[:3]]
    assert set(counts) == {f"{prefix}-{i}" for i in range(n)}, "lost requests"
    assert set(counts.values()) == {1}, "duplicated results"


def _readyz(worker: tp.PipelineProcess) -> tuple[int, str]:
    """Status and body (the helper drops a 503's body, which names the stalled partition)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{worker.http_port}/readyz", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait_status(worker: tp.PipelineProcess, status: int, timeout: float) -> tuple[float, str]:
    """Seconds until ``/readyz`` answers ``status``, and its body."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        code, body = _readyz(worker)
        if code == status:
            return time.monotonic() - started, body
        time.sleep(0.1)
    raise AssertionError(f"/readyz not {status} after {timeout}s:\n{worker.log()}")


def _producing(bootstrap: str, topo: tp.TopologyFiles, records: list[Record], rate: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: asyncio.run(produce(bootstrap, topo.input_topic, records, rate=rate)))
    thread.start()
    return thread


def test_hung_triton_turns_readiness_off_and_back_on_and_loses_nothing(
    kafka_bootstrap: str, own_triton: OwnTriton, tmp_path: Path
) -> None:
    n, rate, hang_s = 3_000, 250.0, 8.0
    topo = tp.write_topology(tmp_path, partitions=2, stage=STAGE)
    records, features = _requests(n, seed=11, prefix="hang")
    with tp.pipeline_process(topo, own_triton.env, tmp_path) as worker:
        producer = _producing(kafka_bootstrap, topo, records, rate)
        time.sleep(3)
        with hung(own_triton):
            to_not_ready, body = _wait_status(worker, 503, timeout=CALL_TIMEOUT_S + STALL_AFTER_S + 10)
            assert "stage classify" in body and "partition" in body, body
            assert worker.get("/livez")[0] == 200, "a hung Triton is no reason to restart the worker"
            age = worker.metric("pipeline_oldest_unfinished_record_age_seconds")
            time.sleep(max(0.0, hang_s - to_not_ready))
        to_ready = _ready_again(worker, own_triton, timeout=90)
        producer.join(timeout=60)
        out = tp.collect_outputs(kafka_bootstrap, topo, tp.distinct_keys(n), timeout=120)
        retries = worker.metric("pipeline_triton_retries_total")
        assert worker.terminate() == 0, worker.log()

    dead, counts = _outcomes(out, topo, features, "hang")
    print(
        f"\nhang: {n} requests, {sum(counts.values())} results for {len(counts)} ids, {len(dead)} dead letters, "
        f"not ready {to_not_ready:.1f}s after SIGSTOP (call timeout {CALL_TIMEOUT_S:g}s, stall after "
        f"{STALL_AFTER_S:g}s), ready {to_ready:.1f}s after SIGCONT, {retries:.0f} retries, "
        f"oldest-record age seen {age:.1f}s"
    )
    _assert_each_answered_once(dead, counts, "hang", n)
    assert to_not_ready <= CALL_TIMEOUT_S + STALL_AFTER_S + 3
    assert retries > 0


def test_sigterm_while_triton_hangs_exits_within_bound_and_the_next_owner_finishes(
    kafka_bootstrap: str, own_triton: OwnTriton, tmp_path: Path
) -> None:
    """Default drain_timeout_s (30 s): the acceptance's bound, in the state that used to hang."""
    n = 1_200
    topo = tp.write_topology(tmp_path, partitions=2, stage=STAGE)
    records, features = _requests(n, seed=12, prefix="term")
    with tp.pipeline_process(topo, own_triton.env, tmp_path) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records[: n // 2]))
        tp.collect_outputs(kafka_bootstrap, topo, tp.distinct_keys(n // 2), timeout=60)
        with hung(own_triton):
            asyncio.run(produce(kafka_bootstrap, topo.input_topic, records[n // 2 :]))
            # Batches now wait in the outage loop: a call timed out and was retried (on a busy
            # machine the records may take a while to be fetched and sent, so wait for it).
            deadline = time.monotonic() + CALL_TIMEOUT_S + 30
            while worker.metric("pipeline_triton_retries_total") <= 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert worker.metric("pipeline_triton_retries_total") > 0, worker.log()
            stopped = time.monotonic()
            code = worker.terminate(timeout=60)
            exit_s = time.monotonic() - stopped
        assert code == 0, worker.log()
        first_log = worker.log()
    # SIGCONT done; the group's next member replays whatever was left uncommitted.
    with tp.pipeline_process(topo, own_triton.env, tmp_path) as successor:
        out = tp.collect_outputs(kafka_bootstrap, topo, tp.distinct_keys(n), timeout=120)
        assert successor.terminate() == 0, successor.log()

    dead, counts = _outcomes(out, topo, features, "term")
    print(
        f"\nsigterm during hang: exit code {code} after {exit_s:.1f}s (bound 30s); {n} requests, "
        f"{sum(counts.values())} results for {len(counts)} ids, {len(dead)} dead letters"
    )
    assert exit_s < 30, first_log
    _assert_each_answered_once(dead, counts, "term", n)


def test_hung_triton_under_a_sequence_stage_is_an_outage_not_a_loss(
    kafka_bootstrap: str, own_triton: OwnTriton, tmp_path: Path
) -> None:
    streams = {f"seq-{i:02d}": i % 3 for i in range(8)}
    stage = dict(st.SEQUENCE_STAGE, call_timeout_s=CALL_TIMEOUT_S, stall_after_s=STALL_AFTER_S + 1)
    stage["retry"] = {"initial_backoff_ms": 50.0, "max_backoff_ms": 500.0}
    topo = tp.write_topology(tmp_path, partitions=2, stages=[stage])
    records = st.interleave([st.stream_records(key, st.utterance(u)) for key, u in streams.items()])
    with tp.pipeline_process(topo, own_triton.env, tmp_path) as worker:
        producer = _producing(kafka_bootstrap, topo, records, rate=200.0)
        deadline = time.monotonic() + 60
        while worker.metric("pipeline_results_total") < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        with hung(own_triton):
            to_not_ready, body = _wait_status(worker, 503, timeout=CALL_TIMEOUT_S + STALL_AFTER_S + 15)
            assert "stage vad" in body, body
            assert worker.get("/livez")[0] == 200
            time.sleep(max(0.0, 8.0 - to_not_ready))
        to_ready = _ready_again(worker, own_triton, timeout=90)
        producer.join(timeout=120)
        out: Collected = tp.collect_outputs(kafka_bootstrap, topo, _summaries(set(streams)), timeout=180)
        assert worker.terminate() == 0, worker.log()

    dead = out.on(topo.dead_letter_topic)
    results = st.gather(out.on(topo.result_topic))
    duplicates = sum(results[key].duplicates for key in streams if key in results)
    print(
        f"\nsequence hang: {len(records)} chunks in {len(streams)} streams, {len(dead)} dead letters, "
        f"{duplicates} duplicates; not ready {to_not_ready:.1f}s after SIGSTOP, ready {to_ready:.1f}s after SIGCONT"
    )
    assert dead == []
    assert set(results) == set(streams)
    for key, u in streams.items():
        st.assert_stream_matches(results[key], st.expected(u), key)


def _summaries(keys: set[str]) -> Callable[[list[ConsumerRecord[bytes, bytes]]], bool]:
    def done(records: list[ConsumerRecord[bytes, bytes]]) -> bool:
        return {r.key.decode() for r in records if header(r, "result-type") == "summary"} >= keys

    return done
