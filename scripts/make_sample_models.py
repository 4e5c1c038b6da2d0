"""Write the stateless sample models' ONNX graphs (and their shared Python-backend runner).

- ``dense_classifier``: a tiny, deterministic 2-layer MLP.
- ``feature_norm``: standardises 16 raw features (``raw`` -> ``features``).
- ``anomaly_score``: the L2 norm of the features (``features`` -> ``score``).

The last two exist for the ensemble example (``topologies/ensemble.yaml``): one
preprocessing step feeding two models in parallel. Every stateless model runs
the same ``model.py`` (ONNX through onnxruntime, tensor names from the model's
config), written from ``RUNNER`` below into each model's version folder.

Why a generated graph instead of a downloaded one: it is small enough to commit,
reproducible byte for byte (numpy seed 0), and its weights live only in the ONNX
initializers, so the tests compute their reference from the file itself.

Graph: ``features`` FP32 [batch, 16] -> Gemm(16->32) -> Relu -> Gemm(32->4) -> ``logits`` [batch, 4].
Opset 13 / IR 7 so that every onnxruntime in use (this venv, Triton NGC images) loads it.

Run: ``python scripts/make_sample_models.py [--out sample_models]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
IR_VERSION = 7
IN_FEATURES, HIDDEN, CLASSES = 16, 32, 4
REPO_ROOT = Path(__file__).resolve().parent.parent


def build_dense_classifier(seed: int = 0) -> onnx.ModelProto:
    """The MLP with He-style initialised weights drawn from ``numpy.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((HIDDEN, IN_FEATURES)) * np.sqrt(2.0 / IN_FEATURES)).astype(
        np.float32
    )
    b1 = (rng.standard_normal(HIDDEN) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((CLASSES, HIDDEN)) * np.sqrt(2.0 / HIDDEN)).astype(np.float32)
    b2 = (rng.standard_normal(CLASSES) * 0.1).astype(np.float32)

    nodes = [
        # transB=1: weights stored [out, in] like a torch Linear layer.
        helper.make_node("Gemm", ["features", "w1", "b1"], ["h1"], transB=1, name="fc1"),
        helper.make_node("Relu", ["h1"], ["a1"], name="relu1"),
        helper.make_node("Gemm", ["a1", "w2", "b2"], ["logits"], transB=1, name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "dense_classifier",
        inputs=[
            helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", IN_FEATURES])
        ],
        outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b2, "b2"),
        ],
    )
    return _finish(graph)


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    """The model of ``graph``: our opset, IR version and producer name, checked."""
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="streaming-inference-pipeline/scripts/make_sample_models.py",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def build_feature_norm(seed: int = 1) -> onnx.ModelProto:
    """``features = (raw - mean) / std`` with fixed per-feature statistics."""
    rng = np.random.default_rng(seed)
    mean = rng.standard_normal(IN_FEATURES).astype(np.float32)
    std = rng.uniform(0.5, 2.0, IN_FEATURES).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Sub", ["raw", "mean"], ["centred"], name="centre"),
            helper.make_node("Div", ["centred", "std"], ["features"], name="scale"),
        ],
        "feature_norm",
        inputs=[helper.make_tensor_value_info("raw", TensorProto.FLOAT, ["batch", IN_FEATURES])],
        outputs=[helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", IN_FEATURES])],
        initializer=[numpy_helper.from_array(mean, "mean"), numpy_helper.from_array(std, "std")],
    )
    return _finish(graph)


def build_anomaly_score() -> onnx.ModelProto:
    """``score`` = the L2 norm of ``features`` per row ([batch, 1])."""
    graph = helper.make_graph(
        [helper.make_node("ReduceL2", ["features"], ["score"], axes=[1], keepdims=1, name="norm")],
        "anomaly_score",
        inputs=[helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", IN_FEATURES])],
        outputs=[helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])],
    )
    return _finish(graph)


RUNNER = '''"""Triton Python-backend model: one ONNX graph run through onnxruntime (generated file).

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
'''

MODELS = {
    "dense_classifier": build_dense_classifier,
    "feature_norm": build_feature_norm,
    "anomaly_score": build_anomaly_score,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "sample_models")
    args = parser.parse_args()
    for name, build in MODELS.items():
        folder = args.out / name / "1"
        folder.mkdir(parents=True, exist_ok=True)
        onnx.save(build(), str(folder / "model.onnx"))
        (folder / "model.py").write_text(RUNNER)
        print(f"wrote {folder}/model.onnx and model.py")


if __name__ == "__main__":
    main()
