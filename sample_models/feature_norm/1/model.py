"""Triton Python-backend model: one ONNX graph run through onnxruntime (generated file).

Written by scripts/make_sample_models.py into every stateless sample model. The
embedded Triton build has no onnxruntime backend, so the graph runs inside this
Python model. Triton's dynamic batcher hands ``execute`` several requests at once;
they are concatenated into one onnxruntime call and split back per request. Tensor
names come from the model's config.pbtxt (one input, one output).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Stateless batch-in, batch-out ONNX model."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self._input = config["input"][0]["name"]
        self._output = config["output"][0]["name"]
        # The repository may be a temporary copy (e.g. downloaded from S3): find the graph
        # relative to where Triton says this version lives.
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        opts = ort.SessionOptions()
        # One thread per instance: Triton scales with instance_group, not intra-op threads.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self._session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])

    def execute(self, requests: list[Any]) -> list[Any]:
        arrays = [pb_utils.get_input_tensor_by_name(r, self._input).as_numpy() for r in requests]
        sizes = [a.shape[0] for a in arrays]
        batch = np.concatenate(arrays, axis=0).astype(np.float32, copy=False)
        (result,) = self._session.run([self._output], {self._input: batch})
        responses = []
        for part in np.split(result, np.cumsum(sizes)[:-1], axis=0):
            out = pb_utils.Tensor(self._output, np.ascontiguousarray(part, dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self) -> None:
        self._session = None
