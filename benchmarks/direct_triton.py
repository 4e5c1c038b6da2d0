"""A model's own rate over gRPC, with no Kafka and no stage: the bound a stage cannot beat.

Used by ``benchmarks.ensemble`` for the fused case: the slower member of the
fused chain, called directly in batches of the size a stage sends (64 rows,
4 calls in flight, as the stage's batching defaults), rows per second over a
fixed number of calls after a warm-up. The client comes from
:mod:`pipeline.triton.client`, like every Triton client of the project.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from tritonclient.grpc import InferInput

from benchmarks.common import BenchmarkFailure
from pipeline.settings import TritonSettings
from pipeline.triton.client import aio_client


async def direct_rows_per_s(
    triton: TritonSettings,
    model: str,
    input_name: str,
    rows: np.ndarray,
    *,
    batch: int = 64,
    inflight: int = 4,
    calls: int = 200,
) -> float:
    """Rows per second of ``calls`` batched calls of ``model`` (``batch`` rows of ``rows`` each)."""
    client = aio_client(triton)
    data = np.ascontiguousarray(rows[:batch], dtype=np.float32)
    if len(data) != batch:
        raise BenchmarkFailure(f"direct {model}: {len(rows)} rows given, {batch} needed")

    async def one() -> None:
        tensor = InferInput(input_name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        response = await client.infer(model, [tensor])
        if response.get_response().outputs[0].shape[0] != batch:
            raise BenchmarkFailure(f"direct {model}: a call returned another batch size")

    async def worker(n: int) -> None:
        for _ in range(n):
            await one()

    try:
        await asyncio.gather(*(worker(5) for _ in range(inflight)))  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*(worker(calls // inflight) for _ in range(inflight)))
        elapsed = time.perf_counter() - started
    finally:
        await client.close()
    return batch * (calls // inflight) * inflight / elapsed
