"""Triton Python-backend model: the dense_classifier MLP run through onnxruntime.

Why the Python backend: the embedded Triton build has no onnxruntime backend, so
the ONNX graph is executed by onnxruntime inside this model. Triton's dynamic
batcher hands ``execute`` several requests at once; they are concatenated into a
single onnxruntime call (that is the point of batching) and split back per request.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Stateless batch-in, batch-out ONNX model."""

    def initialize(self, args: dict[str, str]) -> None:
        # The repository may be a temporary copy (e.g. downloaded from S3), so the
        # ONNX file is always found relative to where Triton says this version lives.
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        opts = ort.SessionOptions()
        # One thread per instance: Triton scales with instance_group, not intra-op threads.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            path, sess_options=opts, providers=["CPUExecutionProvider"]
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        arrays = [pb_utils.get_input_tensor_by_name(r, "features").as_numpy() for r in requests]
        sizes = [a.shape[0] for a in arrays]
        features = np.concatenate(arrays, axis=0).astype(np.float32, copy=False)
        (logits,) = self._session.run(["logits"], {"features": features})
        responses = []
        for part in np.split(logits, np.cumsum(sizes)[:-1], axis=0):
            out = pb_utils.Tensor("logits", np.ascontiguousarray(part, dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self) -> None:
        self._session = None
