"""Write ``sample_models/dense_classifier/1/model.onnx``: a tiny, deterministic 2-layer MLP.

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
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="streaming-inference-pipeline/scripts/make_sample_models.py",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "sample_models")
    args = parser.parse_args()
    target = args.out / "dense_classifier" / "1" / "model.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build_dense_classifier(), str(target))
    print(f"wrote {target} ({target.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
