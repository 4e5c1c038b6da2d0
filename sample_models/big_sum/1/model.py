"""Triton Python-backend model ``big_sum``: statistics of a 1 MiB FP32 row.

Exists to move large tensors (pipeline/triton/shared_memory.py): ``samples``
[batch, 262144] in; ``stats`` [batch, 4] (sum, min, max, mean, in float64 then
cast, so the result does not depend on how rows are batched) and ``doubled``
[batch, 262144] (the input times two, exact in FP32) out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Stateless batch-in, batch-out; each request's rows are computed on their own."""

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            samples = pb_utils.get_input_tensor_by_name(request, "samples").as_numpy()
            wide = samples.astype(np.float64)
            stats = np.stack([wide.sum(axis=1), wide.min(axis=1), wide.max(axis=1), wide.mean(axis=1)], axis=1)
            outputs = [
                pb_utils.Tensor("stats", stats.astype(np.float32)),
                pb_utils.Tensor("doubled", np.ascontiguousarray(samples * np.float32(2), dtype=np.float32)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
