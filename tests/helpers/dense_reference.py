"""numpy forward pass of sample_models/dense_classifier, weights read from its ONNX file."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

MODEL_FILE = Path(__file__).resolve().parents[2] / "sample_models" / "dense_classifier" / "1" / "model.onnx"


@lru_cache(maxsize=1)
def _weights() -> dict[str, np.ndarray]:
    model = onnx.load(str(MODEL_FILE))
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}


def mlp_reference(features: np.ndarray) -> np.ndarray:
    """Logits for ``features`` [rows, 16], computed in float64."""
    w = _weights()
    hidden = np.maximum(np.asarray(features, dtype=np.float64) @ w["w1"].T + w["b1"], 0.0)
    return hidden @ w["w2"].T + w["b2"]


def random_features(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 16)).astype(np.float32)


def _initializers(model: str) -> dict[str, np.ndarray]:
    path = MODEL_FILE.parents[2] / model / "1" / "model.onnx"
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in onnx.load(str(path)).graph.initializer}


def norm_reference(raw: np.ndarray) -> np.ndarray:
    """sample_models/feature_norm: (raw - mean) / std."""
    w = _initializers("feature_norm")
    return (np.asarray(raw, np.float64) - w["mean"]) / w["std"]


def score_reference(features: np.ndarray) -> np.ndarray:
    """sample_models/anomaly_score: the L2 norm of each row, [rows, 1]."""
    return np.linalg.norm(np.asarray(features, np.float64), axis=1, keepdims=True)
