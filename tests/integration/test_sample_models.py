"""The sample models in ``sample_models/``, served by a real Triton loaded from S3.

References are computed independently, in-process: the MLP from the ONNX
initializers with numpy, Silero VAD with onnxruntime chunk by chunk (the
``tests.helpers.vad_reference`` runner). The last two tests load the VAD
``model.py`` in-process with a stand-in ``triton_python_backend_utils`` to reach
paths Triton's scheduler never produces (two chunks of one sequence in one batch,
a sequence the model forgot, idle eviction); they need no server.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import random
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from pipeline.settings import TritonSettings
from pipeline.triton.client import aio_client, sync_client
from tests.helpers.dense_reference import mlp_reference as _mlp_reference
from tests.helpers.dense_reference import random_features as _features
from tests.helpers.vad_reference import (
    CHUNK,
    CHUNK_SECONDS,
    SAMPLE_RATE,
    VadStream,
    speech_with_silence,
    to_chunks,
    vad_session,
)

SAMPLE_MODELS = Path(__file__).resolve().parents[2] / "sample_models"
# Unique per run, so a sequence left open by an earlier run on an external server never collides.
_sequence_ids = itertools.count(random.randrange(1, 2**40) * 1000)


# ---------------------------------------------------------------- dense_classifier


def test_dense_classifier_batch(triton_grpc_url: str) -> None:
    features = _features(8, seed=1)
    inp = grpcclient.InferInput("features", list(features.shape), "FP32")
    inp.set_data_from_numpy(features)
    with sync_client(TritonSettings(grpc_url=triton_grpc_url)) as client:
        logits = client.infer("dense_classifier", [inp]).as_numpy("logits")
    assert logits.shape == (8, 4) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, _mlp_reference(features), rtol=1e-5, atol=1e-6)


def test_big_sum_batch(triton_grpc_url: str) -> None:
    """big_sum (the shared-memory model): stats of each 1 MiB row in float64, the row doubled."""
    samples = np.random.default_rng(3).standard_normal((2, 262_144)).astype(np.float32)
    inp = grpcclient.InferInput("samples", list(samples.shape), "FP32")
    inp.set_data_from_numpy(samples)
    with sync_client(TritonSettings(grpc_url=triton_grpc_url)) as client:
        result = client.infer("big_sum", [inp])
    wide = samples.astype(np.float64)
    expected = np.stack([wide.sum(1), wide.min(1), wide.max(1), wide.mean(1)], axis=1).astype(np.float32)
    np.testing.assert_array_equal(result.as_numpy("stats"), expected)
    np.testing.assert_array_equal(result.as_numpy("doubled"), samples * np.float32(2))


@pytest.mark.triton
async def test_dense_classifier_concurrent_batch1(triton_grpc_url: str) -> None:
    """Many concurrent batch-1 requests: the dynamic batcher merges them, each answer stays its own."""
    features = _features(256, seed=2)
    expected = _mlp_reference(features)
    client = aio_client(TritonSettings(grpc_url=triton_grpc_url))
    try:

        async def one(row: np.ndarray) -> np.ndarray:
            inp = grpcaio.InferInput("features", [1, 16], "FP32")
            inp.set_data_from_numpy(row[None, :])
            return (await client.infer("dense_classifier", [inp])).as_numpy("logits")[0]

        results = await asyncio.gather(*(one(row) for row in features))
    finally:
        await client.close()
    np.testing.assert_allclose(np.stack(results), expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- silero_vad


@dataclass
class SequenceResult:
    probs: np.ndarray
    state: np.ndarray  # last state_out [2, 128]
    context: np.ndarray  # last context_out [64]


def _vad_inputs(
    chunk: np.ndarray, state: np.ndarray | None = None, context: np.ndarray | None = None
) -> list[grpcclient.InferInput]:
    inputs = []
    for name, value in (("audio", chunk), ("state_in", state), ("context_in", context)):
        if value is not None:
            arr = np.ascontiguousarray(value[None, ...], np.float32)
            inp = grpcclient.InferInput(name, list(arr.shape), "FP32")
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
    return inputs


def _run_sequence(
    client: grpcclient.InferenceServerClient,
    chunks: np.ndarray,
    sequence_id: int,
    state: np.ndarray | None = None,
    context: np.ndarray | None = None,
    end: bool = True,
) -> SequenceResult:
    """Send ``chunks`` as one Triton sequence; ``state``/``context`` seed the START request."""
    probs = []
    for i, chunk in enumerate(chunks):
        first = i == 0
        result = client.infer(
            "silero_vad",
            _vad_inputs(chunk, state if first else None, context if first else None),
            sequence_id=sequence_id,
            sequence_start=first,
            sequence_end=end and i == len(chunks) - 1,
        )
        probs.append(result.as_numpy("probability")[0, 0])
    return SequenceResult(
        np.array(probs, np.float32),
        result.as_numpy("state_out")[0],
        result.as_numpy("context_out")[0],
    )


@pytest.fixture(scope="module")
def vad_client(triton_grpc_url: str) -> Iterator[grpcclient.InferenceServerClient]:
    with sync_client(TritonSettings(grpc_url=triton_grpc_url)) as client:
        yield client


@pytest.fixture(scope="module")
def speech_chunks() -> np.ndarray:
    return to_chunks(speech_with_silence(pad_s=1.0))


@pytest.mark.triton
def test_vad_speech_matches_reference_and_timing(
    vad_client: grpcclient.InferenceServerClient, speech_chunks: np.ndarray
) -> None:
    served = _run_sequence(vad_client, speech_chunks, next(_sequence_ids))
    reference = VadStream(vad_session()).run(speech_chunks)
    np.testing.assert_allclose(served.probs, reference, atol=1e-5)

    chunk_start_s = np.arange(len(served.probs)) * CHUNK_SECONDS
    lead_in = chunk_start_s + CHUNK_SECONDS <= 1.0  # chunks wholly inside the 1 s of silence
    assert served.probs[lead_in].max() < 0.5
    detected = np.flatnonzero(served.probs > 0.5)
    assert detected.size, "no speech detected"
    assert abs(chunk_start_s[detected[0]] - 1.0) <= 0.1, (
        f"speech first detected at {chunk_start_s[detected[0]]:.3f} s"
    )


@pytest.mark.triton
def test_vad_silence_never_speech(vad_client: grpcclient.InferenceServerClient) -> None:
    silence = np.zeros(2 * SAMPLE_RATE, np.float32)
    served = _run_sequence(vad_client, to_chunks(silence), next(_sequence_ids))
    assert served.probs.max() < 0.5


@pytest.mark.triton
def test_vad_resume_from_returned_state(
    vad_client: grpcclient.InferenceServerClient, speech_chunks: np.ndarray
) -> None:
    """A client that kept the last state_out/context_out resumes under a NEW sequence id exactly."""
    whole = _run_sequence(vad_client, speech_chunks, next(_sequence_ids))
    half = len(speech_chunks) // 2
    abandoned = next(_sequence_ids)
    first = _run_sequence(vad_client, speech_chunks[:half], abandoned, end=False)
    try:
        # The first sequence is left open (as after a client crash) while a new one resumes it.
        rest = _run_sequence(
            vad_client, speech_chunks[half:], next(_sequence_ids), first.state, first.context
        )
    finally:
        # Close it anyway: a live sequence holds Triton's shutdown until it idles out (10 s).
        vad_client.infer(
            "silero_vad", _vad_inputs(speech_chunks[0]), sequence_id=abandoned, sequence_end=True
        )
    np.testing.assert_allclose(np.concatenate([first.probs, rest.probs]), whole.probs, atol=1e-6)


@pytest.mark.triton
def test_vad_unknown_sequence_is_an_error_not_a_crash(
    vad_client: grpcclient.InferenceServerClient, speech_chunks: np.ndarray
) -> None:
    with pytest.raises(InferenceServerException):
        vad_client.infer(
            "silero_vad", _vad_inputs(speech_chunks[0]), sequence_id=next(_sequence_ids)
        )
    served = _run_sequence(vad_client, speech_chunks[:8], next(_sequence_ids))
    np.testing.assert_allclose(
        served.probs, VadStream(vad_session()).run(speech_chunks[:8]), atol=1e-5
    )
    assert vad_client.is_model_ready("silero_vad")


@pytest.mark.triton
async def test_vad_concurrent_sequences_keep_their_own_state(
    triton_grpc_url: str, speech_chunks: np.ndarray
) -> None:
    """Interleaved streams are batched together server-side; none may see another's state."""
    offsets = [0, 3, 7, 11, 19, 23]
    streams = [np.roll(speech_chunks, k, axis=0) for k in offsets]
    client = aio_client(TritonSettings(grpc_url=triton_grpc_url))
    try:

        async def stream(chunks: np.ndarray) -> np.ndarray:
            sid, probs = next(_sequence_ids), []
            for i, chunk in enumerate(chunks):
                inp = grpcaio.InferInput("audio", [1, CHUNK], "FP32")
                inp.set_data_from_numpy(chunk[None, :].astype(np.float32))
                result = await client.infer(
                    "silero_vad",
                    [inp],
                    sequence_id=sid,
                    sequence_start=i == 0,
                    sequence_end=i == len(chunks) - 1,
                )
                probs.append(result.as_numpy("probability")[0, 0])
            return np.array(probs, np.float32)

        served = await asyncio.gather(*(stream(s) for s in streams))
    finally:
        await client.close()
    session = vad_session()
    for chunks, probs in zip(streams, served, strict=False):
        np.testing.assert_allclose(probs, VadStream(session).run(chunks), atol=1e-5)


# ------------------------------------------------- silero_vad model.py, in-process


class _FakeTensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class _FakeResponse:
    def __init__(self, output_tensors: list[_FakeTensor], error: Any = None) -> None:
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors}
        self.error = error


class _FakeError(Exception):
    pass


@pytest.fixture
def vad_model(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The VAD model.py with a minimal stand-in for Triton's ``triton_python_backend_utils``."""
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = _FakeTensor  # type: ignore[attr-defined]
    pb.InferenceResponse = _FakeResponse  # type: ignore[attr-defined]
    pb.TritonError = _FakeError  # type: ignore[attr-defined]
    pb.get_input_tensor_by_name = lambda req, name: (  # type: ignore[attr-defined]
        _FakeTensor(name, req[name]) if name in req else None
    )
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ inside sample_models/
    spec = importlib.util.spec_from_file_location(
        "silero_vad_model", SAMPLE_MODELS / "silero_vad/1/model.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(
        sys.modules, spec.name, module
    )  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    config = (SAMPLE_MODELS / "silero_vad" / "config.pbtxt").read_text()
    idle_us = int(config.split("max_sequence_idle_microseconds:")[1].split()[0])
    model.initialize(
        {
            "model_repository": str(SAMPLE_MODELS / "silero_vad"),
            "model_version": "1",
            "model_config": json.dumps(
                {"sequence_batching": {"max_sequence_idle_microseconds": str(idle_us)}}
            ),
        }
    )
    model.module = module
    return model


def _request(
    corrid: int, chunk: np.ndarray, start: bool = False, end: bool = False
) -> dict[str, np.ndarray]:
    return {
        "audio": chunk[None, :].astype(np.float32),
        "START": np.array([[int(start)]], np.int32),
        "END": np.array([[int(end)]], np.int32),
        "READY": np.array([[1]], np.int32),
        "CORRID": np.array([[corrid]], np.uint64),
    }


def test_vad_model_orders_chunks_of_one_sequence_in_one_batch(
    vad_model: Any, speech_chunks: np.ndarray
) -> None:
    """Two sequences, two chunks each, in ONE execute(): per-sequence order must be kept."""
    a, b = speech_chunks[30:32], speech_chunks[40:42]
    batch = [
        _request(1, a[0], start=True),
        _request(2, b[0], start=True),
        _request(1, a[1]),
        _request(2, b[1]),
    ]
    out = vad_model.execute(batch)
    assert all(r.error is None for r in out)
    session = vad_session()
    np.testing.assert_allclose(
        [out[0].outputs["probability"][0, 0], out[2].outputs["probability"][0, 0]],
        VadStream(session).run(a),
        atol=1e-6,
    )
    np.testing.assert_allclose(
        [out[1].outputs["probability"][0, 0], out[3].outputs["probability"][0, 0]],
        VadStream(session).run(b),
        atol=1e-6,
    )


def test_vad_model_unknown_sequence_end_and_idle_eviction(
    vad_model: Any, speech_chunks: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunk = speech_chunks[0]
    (unknown,) = vad_model.execute([_request(7, chunk)])
    assert "unknown sequence 7: send START with state_in/context_in to resume" in str(unknown.error)

    vad_model.execute([_request(8, chunk, start=True), _request(9, chunk, start=True, end=True)])
    assert set(vad_model._sequences) == {8}  # END removed 9

    clock = vad_model.module.time.monotonic() + 3600.0  # an hour later: far past the idle limit
    monkeypatch.setattr(vad_model.module.time, "monotonic", lambda: clock)
    (late,) = vad_model.execute([_request(8, chunk)])
    assert "unknown sequence 8" in str(late.error) and not vad_model._sequences
