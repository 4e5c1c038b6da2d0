"""Large tensors through Triton system shared memory: `pipeline run` against the real
broker, S3 and the embedded (local) tritonserver, with ``sample_models/big_sum``
(1 MiB FP32 rows in; stats [4] and the 1 MiB row doubled out).

- the same requests give identical results with ``shared_memory`` on and off, and the
  regions are registered with Triton while the worker runs; a clean shutdown leaves
  none, in Triton's status or in ``/dev/shm``;
- after kill -9 (worker and its children) the regions stay behind; the next start
  removes them from Triton and from ``/dev/shm``;
- Triton forgetting the registrations (as after its restart) costs no request: the
  batch goes inside the gRPC message, is counted as a fallback, and the next ones
  re-register.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from pipeline.contract.records import Record
from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from pipeline.settings import TritonSettings
from pipeline.triton.client import sync_client
from tests.helpers.topology_process import (
    PipelineProcess,
    TopologyFiles,
    collect_outputs,
    pipeline_process,
    write_topology,
)

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

ROW = 262_144
MiB = 1 << 20
SHM = Path("/dev/shm")


def _topology(tmp_path: Path, mode: str) -> TopologyFiles:
    return write_topology(
        tmp_path,
        partitions=1,
        stage={
            "name": "bigsum",
            "model": "big_sum",
            "max_request_bytes": 8 * MiB,
            "batching": {"max_queue_delay_ms": 5.0, "max_inflight_batches": 2, "max_batch_size": 4},
            "shared_memory": {"mode": mode, "threshold_bytes": 256 * 1024},
        },
    )


def _requests(n: int, seed: int = 7, prefix: str = "r") -> tuple[list[Record], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    rows = {f"{prefix}{i}": rng.standard_normal((1, ROW)).astype(np.float32) for i in range(n)}
    records = [encode_request({"samples": row}, correlation_id=key) for key, row in rows.items()]
    return [Record(key.encode(), r.value, r.headers) for key, r in zip(rows, records, strict=True)], rows


def _produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=8 * MiB, acks="all")
        await producer.start()
        try:
            for record in records:
                await producer.send_and_wait(topic, record.value, key=record.key, headers=record.headers)
        finally:
            await producer.stop()

    asyncio.run(send())


def _results(bootstrap: str, topo: TopologyFiles, n: int) -> dict[str, dict[str, np.ndarray]]:
    out = collect_outputs(bootstrap, topo, lambda rs: len(rs) >= n, timeout=120)
    assert out.on(topo.dead_letter_topic) == [], "no request may be dead-lettered"
    records: list[ConsumerRecord[bytes, bytes]] = out.on(topo.result_topic)
    assert len(records) == n
    decoded = {}
    for record in records:
        response = decode_response(record.value, record.headers)
        decoded[response.correlation_id] = {k: np.asarray(v) for k, v in response.outputs.items()}
    return decoded


def _check_reference(results: dict[str, dict[str, np.ndarray]], rows: dict[str, np.ndarray]) -> None:
    assert set(results) == set(rows)
    for key, row in rows.items():
        wide = row.astype(np.float64)
        expected = np.array([[wide.sum(), wide.min(), wide.max(), wide.mean()]], dtype=np.float32)
        np.testing.assert_array_equal(results[key]["stats"], expected)
        np.testing.assert_array_equal(results[key]["doubled"], row * np.float32(2))


def _triton_regions(triton_grpc_url: str) -> dict[str, Any]:
    with sync_client(TritonSettings(grpc_url=triton_grpc_url)) as client:
        return dict(client.get_system_shared_memory_status().regions)


def _of(pid: int, names: Any) -> list[str]:
    return sorted(n for n in names if n.startswith("pipeline-bigsum-") and n.split("-")[-2] == str(pid))


def _shm_files(pid: int) -> list[str]:
    return _of(pid, (p.name for p in SHM.iterdir()))


def _kill_tree(worker: PipelineProcess) -> None:
    """SIGKILL the worker's children (multiprocessing's resource tracker would otherwise
    unlink its segments) and then the worker: a container killed whole."""
    for child in Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split():
        os.kill(int(child), signal.SIGKILL)
    worker.kill()


def test_results_identical_with_and_without_shared_memory_and_nothing_left(
    kafka_bootstrap: str, cli_env: dict[str, str], triton_grpc_url: str, tmp_path: Path
) -> None:
    records, rows = _requests(10)
    results = {}
    for mode in ("off", "on"):
        topo = _topology(tmp_path, mode)
        with pipeline_process(topo, cli_env, tmp_path) as worker:
            _produce(kafka_bootstrap, topo.input_topic, records)
            results[mode] = _results(kafka_bootstrap, topo, len(records))
            registered = _of(worker.pid, _triton_regions(triton_grpc_url))
            files = _shm_files(worker.pid)
            sent_shm = worker.metric("pipeline_triton_shared_memory_total", outcome="shm")
            fallbacks = worker.metric("pipeline_triton_shared_memory_total", outcome="fallback")
            pid = worker.pid
            assert worker.terminate(timeout=60) == 0, worker.log()
        if mode == "off":
            assert registered == [] and files == [] and sent_shm == 0
        else:
            assert registered and registered == files, (registered, files)
            assert sent_shm >= 3 and fallbacks == 0  # 10 rows, batches of at most 4
            # A clean shutdown unregisters and unlinks every region.
            assert _of(pid, _triton_regions(triton_grpc_url)) == []
            assert _shm_files(pid) == []
    _check_reference(results["on"], rows)
    for key in rows:
        for name in ("stats", "doubled"):
            np.testing.assert_array_equal(results["on"][key][name], results["off"][key][name])


def test_kill_9_leaves_regions_the_next_start_removes(
    kafka_bootstrap: str, cli_env: dict[str, str], triton_grpc_url: str, tmp_path: Path
) -> None:
    topo = _topology(tmp_path, "on")
    records, rows = _requests(4, seed=8)
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        _produce(kafka_bootstrap, topo.input_topic, records)
        _check_reference(_results(kafka_bootstrap, topo, len(records)), rows)
        killed = worker.pid
        _kill_tree(worker)
    left = _of(killed, _triton_regions(triton_grpc_url))
    assert left and _shm_files(killed) == left, "kill -9 leaves its regions behind (the premise)"

    with pipeline_process(topo, cli_env, tmp_path) as again:
        assert _of(killed, _triton_regions(triton_grpc_url)) == []
        assert _shm_files(killed) == []
        assert "stale shared-memory region" in again.log()
        assert again.terminate(timeout=60) == 0, again.log()


def test_forgotten_registration_falls_back_without_losing_a_request(
    kafka_bootstrap: str, cli_env: dict[str, str], triton_grpc_url: str, tmp_path: Path
) -> None:
    """Unregistering our regions behind the worker's back is what a Triton restart does."""
    topo = _topology(tmp_path, "auto")
    first, first_rows = _requests(4, seed=9)
    second, second_rows = _requests(6, seed=10, prefix="b")
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        _produce(kafka_bootstrap, topo.input_topic, first)
        _results(kafka_bootstrap, topo, len(first))
        ours = _of(worker.pid, _triton_regions(triton_grpc_url))
        assert ours, "auto mode is on against the local Triton"
        with sync_client(TritonSettings(grpc_url=triton_grpc_url)) as client:
            for name in ours:
                client.unregister_system_shared_memory(name)
        _produce(kafka_bootstrap, topo.input_topic, second)
        results = _results(kafka_bootstrap, topo, len(first) + len(second))
        # Regions are registered again on their next use. The burst may have grown the pool
        # past a forgotten region (a batch too big for it drops it for a bigger new one), so
        # forget whatever is registered now as well, then send one request at a time: each
        # takes the smallest region, a stale one falls back and is forgotten, and one more
        # than the regions of that size reaches a forgotten region that is registered again.
        now = _of(worker.pid, _triton_regions(triton_grpc_url))
        with sync_client(TritonSettings(grpc_url=triton_grpc_url)) as client:
            for name in now:
                client.unregister_system_shared_memory(name)
        rows = {**first_rows, **second_rows}
        before = worker.metric("pipeline_triton_shared_memory_total", outcome="reregistered")
        for i in range(len(set(ours) | set(now)) + 1):
            if worker.metric("pipeline_triton_shared_memory_total", outcome="reregistered") > before:
                break
            one, one_rows = _requests(1, seed=20 + i, prefix=f"c{i}-")
            rows.update(one_rows)
            _produce(kafka_bootstrap, topo.input_topic, one)
            results = _results(kafka_bootstrap, topo, len(rows))
        assert worker.metric("pipeline_triton_shared_memory_total", outcome="fallback") >= 1
        assert worker.metric("pipeline_triton_shared_memory_total", outcome="reregistered") > before >= 0
        assert "sent inside the gRPC message" in worker.log()
        assert _of(worker.pid, _triton_regions(triton_grpc_url)), "registered again"
        assert worker.terminate(timeout=60) == 0, worker.log()
    _check_reference(results, rows)
