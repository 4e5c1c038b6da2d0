"""Triton Python-backend model ``token_pool``: pooled features of a variable-length sequence.

Inputs ``tokens`` FP32 [batch, L] and ``lengths`` INT32 [batch, 1] (each row's real length,
at most L). Outputs, computed over the real positions ``x = tokens[i, :lengths[i]]`` only:

- ``pooled`` FP32 [batch, 4] = [sum(x), mean(x), max(x), sum(x * w)] with the fixed position
  weights ``w[j] = 1 / (1 + j)`` (0-length rows: zeros);
- ``per_token`` FP32 [batch, L] = ``tanh(x) * 2`` per position; padded positions give 0.

So a row padded with anything, to any length, answers exactly like the unpadded row (the
mean and max would not if padding leaked in). ``reference`` is the same function for tests.
Triton hands ``execute`` several requests at once; each may have its own L, so each request
is one vectorised numpy call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


def reference(tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pooled, per_token) of ``tokens`` [rows, L] with real lengths ``lengths`` [rows] or [rows, 1]."""
    tokens = np.asarray(tokens, np.float32)
    rows, width = tokens.shape
    n = np.clip(np.asarray(lengths, np.int64).reshape(rows), 0, width)
    real = np.arange(width)[None, :] < n[:, None]
    x = np.where(real, tokens, np.float32(0))
    weights = (1.0 / (1.0 + np.arange(width, dtype=np.float32)))[None, :]
    total = x.sum(axis=1)
    mean = np.divide(total, n, out=np.zeros(rows, np.float32), where=n > 0)
    peak = np.where(real, tokens, -np.inf).max(axis=1, initial=-np.inf)
    peak = np.where(n > 0, peak, 0)
    weighted = (x * weights).sum(axis=1)
    pooled = np.stack([total, mean, peak, weighted], axis=1).astype(np.float32)
    per_token = np.where(real, np.tanh(x) * 2, np.float32(0)).astype(np.float32)
    return pooled, per_token


class TritonPythonModel:
    """Stateless, batch-in batch-out; no weights to load."""

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "tokens").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "lengths").as_numpy()
            pooled, per_token = reference(tokens, lengths)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("pooled", pooled), pb_utils.Tensor("per_token", per_token)]
                )
            )
        return responses
