"""The sequence stage end to end: streams through Triton's sequence batcher, with faults.

Every test compares the pipeline's output with the Silero ONNX model run in
process chunk by chunk: a fault (kill -9, Triton restart, rebalance) may add
exact duplicates, never change, lose or reorder an output.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.kafka_io import collect, header, produce
from tests.helpers.own_triton import OwnTriton
from tests.helpers.streams import (
    AUDIO_STAGES,
    SEQUENCE_STAGE,
    StreamResults,
    assert_stream_matches,
    expected,
    gather,
    interleave,
    speech_bounds,
    stream_records,
    utterance,
)
from tests.helpers.topology_process import (
    PipelineProcess,
    TopologyFiles,
    collect_outputs,
    pipeline_process,
    write_topology,
)
from tests.helpers.vad_reference import CHUNK, CHUNK_SECONDS

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

# The same guarantees for the sequence stage alone and for topologies/audio.yaml's
# stages (DALI preprocessing in front, both in one worker process).
TOPOLOGIES = pytest.mark.parametrize("stages", [[SEQUENCE_STAGE], AUDIO_STAGES], ids=["sequence", "dali+sequence"])


def _summaries(keys: set[str]) -> callable:  # type: ignore[valid-type]
    def done(records: list) -> bool:  # type: ignore[type-arg]
        return {r.key.decode() for r in records if header(r, "result-type") == "summary"} >= keys

    return done


def _streams(prefix: str, count: int) -> dict[str, tuple[int, int]]:
    """``count`` streams of the three utterances in turn, each cut into CHUNK-sample chunks."""
    return {f"{prefix}-{i:02d}": (i % 3, CHUNK) for i in range(count)}


def _run_streams(topo, bootstrap: str, streams: dict[str, tuple[int, int]], rate: float = 0.0) -> None:  # type: ignore[no-untyped-def]
    records = interleave([stream_records(key, utterance(u), size) for key, (u, size) in streams.items()])
    asyncio.run(produce(bootstrap, topo.input_topic, records, rate=rate))


def _results(topo: TopologyFiles, bootstrap: str, streams: dict[str, tuple[int, int]], timeout: float) -> dict[str, StreamResults]:
    """Every stream's outputs, once each has its summary; nothing may be dead-lettered."""
    out = collect_outputs(bootstrap, topo, _summaries(set(streams)), timeout=timeout)
    assert out.on(topo.dead_letter_topic) == []
    return gather(out.on(topo.result_topic))


def _one_worker(
    stages: list[dict],  # type: ignore[type-arg]
    partitions: int,
    bootstrap: str,
    env: dict[str, str],
    tmp_path: Path,
    streams: dict[str, tuple[int, int]],
    timeout: float,
) -> dict[str, StreamResults]:
    """On a topology of ``stages``: run a worker, send the streams, collect their results,
    and see the worker exit cleanly."""
    topo = write_topology(tmp_path, partitions=partitions, stages=stages)
    with pipeline_process(topo, env, tmp_path) as worker:
        _run_streams(topo, bootstrap, streams)
        results = _results(topo, bootstrap, streams, timeout)
        assert worker.terminate() == 0
    return results


@TOPOLOGIES
def test_streaming_equals_offline_and_segments_match_speech_timing(
    stages: list[dict],  # type: ignore[type-arg]
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    streams = {"u0-512": (0, CHUNK), "u1-700": (1, 700), "u2-4000": (2, 4000)}
    results = _one_worker(stages, 2, kafka_bootstrap, cli_env, tmp_path, streams, timeout=90)
    for key, (u, size) in streams.items():
        want = expected(u, size)
        assert_stream_matches(results[key], want, key)
        # The segments match where the speech really is: the onset within one chunk; the end
        # within three, because Silero's probability decays over ~2 frames after the energy
        # falls (measured on the reference model itself, not a pipeline effect).
        onset, offset = speech_bounds(u)
        first_start = results[key].segments[0][0]
        last_end = results[key].segments[max(results[key].segments)][1]
        assert abs(first_start - onset) <= CHUNK_SECONDS, f"{key}: speech at {onset:.3f}s, found {first_start:.3f}s"
        assert abs(last_end - offset) <= 3 * CHUNK_SECONDS, f"{key}: speech ends {offset:.3f}s, found {last_end:.3f}s"


@TOPOLOGIES
def test_fifty_concurrent_streams_on_four_partitions_complete_and_in_order(
    stages: list[dict],  # type: ignore[type-arg]
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    streams = _streams("stream", 50)
    results = _one_worker(stages, 4, kafka_bootstrap, cli_env, tmp_path, streams, timeout=180)
    assert set(results) == set(streams)
    for key, (u, size) in streams.items():
        assert_stream_matches(results[key], expected(u, size), key)
        assert results[key].duplicates == 0


def _fault_run(  # type: ignore[no-untyped-def]
    stages: list[dict],  # type: ignore[type-arg]
    kafka_bootstrap: str,
    env: dict[str, str],
    tmp_path: Path,
    streams: dict[str, tuple[int, int]],
    fault,
    rate: float = 600.0,
    seen: list[TopologyFiles] | None = None,
) -> dict:
    """On a 4-partition topology of ``stages``: produce the streams at a steady rate, apply
    ``fault(worker)`` mid-stream, collect everything (the topology appended to ``seen``)."""
    topo = write_topology(tmp_path, partitions=4, stages=stages)
    if seen is not None:
        seen.append(topo)
    worker = PipelineProcess(topo, env, tmp_path / "worker.log").start()
    producer = threading.Thread(target=_run_streams, args=(topo, kafka_bootstrap, streams, rate))
    producer.start()
    deadline = time.monotonic() + 60
    while worker.metric("pipeline_results_total") < 400 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.metric("pipeline_results_total") >= 400, worker.log()
    worker = fault(worker) or worker
    producer.join(timeout=120)
    try:
        return _results(topo, kafka_bootstrap, streams, timeout=180)
    finally:
        worker.terminate()


def _check_faulted(results: dict, streams: dict[str, tuple[int, int]], record_property, name: str) -> None:  # type: ignore[no-untyped-def]
    assert set(results) == set(streams)
    duplicates = 0
    for key, (u, size) in streams.items():
        assert_stream_matches(results[key], expected(u, size), key)
        duplicates += results[key].duplicates
    record_property(f"duplicates_after_{name}", duplicates)
    print(f"\n{name}: {duplicates} exact duplicate results, no other difference")


@TOPOLOGIES
@pytest.mark.parametrize("fault", ["kill_9", "triton_restart"])
def test_a_worker_or_triton_crash_mid_stream_changes_no_output(
    stages: list[dict],  # type: ignore[type-arg]
    fault: str, kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path,
    record_property: pytest.RecordProperty, request: pytest.FixtureRequest,
) -> None:
    """kill -9 of the worker (no drain, no commit, no hand-back), or Triton stopped and started
    (every sequence's state in Triton is gone): the outputs equal a fault-free run's."""
    streams = _streams(fault.replace("_", "-"), 12)
    own_triton: OwnTriton | None = request.getfixturevalue("own_triton") if fault == "triton_restart" else None
    env = own_triton.env if own_triton is not None else cli_env

    def crash(worker: PipelineProcess) -> PipelineProcess | None:
        if own_triton is None:
            worker.kill()
            return PipelineProcess(worker.topology, cli_env, tmp_path / "restarted.log").start()
        own_triton.process.stop()
        time.sleep(2)
        own_triton.process.start()
        return None

    results = _fault_run(stages, kafka_bootstrap, env, tmp_path, streams, crash)
    _check_faulted(results, streams, record_property, fault)


@TOPOLOGIES
def test_second_worker_joining_mid_stream_moves_streams_without_loss_or_reordering(
    stages: list[dict],  # type: ignore[type-arg]
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    streams = _streams("move", 16)
    second: list[PipelineProcess] = []

    def scale_out(first: PipelineProcess) -> None:
        second.append(PipelineProcess(first.topology, cli_env, tmp_path / "second.log").start())

    try:
        # Slow enough that streams are still running when the second worker has joined.
        results = _fault_run(stages, kafka_bootstrap, cli_env, tmp_path, streams, scale_out, rate=60.0)
        moved = second[0].metric("pipeline_results_total")
    finally:
        for worker in second:
            worker.terminate()
    assert moved > 0, "no stream moved to the second worker"
    _check_faulted(results, streams, record_property, "rebalance")


@TOPOLOGIES
def test_kill_9_with_coalesced_checkpoints_changes_no_output(
    stages: list[dict],  # type: ignore[type-arg]
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path, record_property: pytest.RecordProperty,
) -> None:
    """kill -9 while one checkpoint covers up to 16 chunks of a stream: the chunks after a
    stream's last checkpoint are replayed and re-applied from it, so the outputs still equal
    the offline run's (exact duplicates allowed). Produced faster than the worker applies
    them, so streams' chunks queue up and checkpoints really are coalesced (counted)."""
    coalescing = {"checkpoint": {"every_chunks": 16, "max_interval_ms": 1000}}
    stages = [{**s, **coalescing} if s["kind"] == "sequence" else s for s in stages]
    streams = _streams("kill-9-coalesced", 12)

    def crash(worker: PipelineProcess) -> PipelineProcess:
        worker.kill()
        return PipelineProcess(worker.topology, cli_env, tmp_path / "restarted.log").start()

    topo: list[TopologyFiles] = []
    results = _fault_run(stages, kafka_bootstrap, cli_env, tmp_path, streams, crash, rate=3000.0, seen=topo)
    _check_faulted(results, streams, record_property, "kill_9_coalesced")
    state = asyncio.run(collect(kafka_bootstrap, [f"{topo[0].name}.vad.state"], done=lambda _: False, timeout=5))
    chunks = sum(len(r.chunks) for r in results.values())
    record_property("checkpoints_per_chunk", round(len(state.records) / chunks, 3))
    print(f"{len(state.records)} checkpoints for {chunks} chunks")
    assert len(state.records) < chunks / 2, "checkpoints were not coalesced"
