"""Triton Python-backend model: streaming Silero VAD with per-sequence state.

Silero VAD is recurrent: every 512-sample chunk (32 ms at 16 kHz) needs the LSTM
state and the last 64 samples ("context") left by the previous chunk of the same
stream. Triton's sequence batcher routes all chunks of one stream (one correlation
id) to this instance, in order, and tells us START/END/READY/CORRID per request.

Design choices, and why:

* State lives here, keyed by correlation id, so clients send plain audio chunks.
  Each response also carries ``state_out``/``context_out``; a client that keeps the
  last pair can resume the stream after a Triton restart or a worker crash by
  sending START with ``state_in``/``context_in`` (START without them = fresh zeros).
* A non-START request for a sequence this instance does not know is answered with
  an error for that request only, never a crash: the state is gone, and silently
  restarting from zeros would give wrong probabilities.
* All requests of one ``execute`` go through ONE onnxruntime call (audio stacked on
  the batch axis, state on axis 1). If a batch ever holds two chunks of the same
  sequence, it is split into ordered rounds so chunk order is preserved.
* Entries idle longer than ``max_sequence_idle_microseconds`` (plus a grace period,
  so we never drop a sequence Triton still considers live) are evicted: a client
  that vanishes without END cannot leak memory.
* Context handling matches silero_vad.utils_vad.OnnxWrapper: the model input is
  ``concat(context, chunk)`` and the next context is the last 64 samples of it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

SAMPLE_RATE = 16000
CHUNK = 512
CONTEXT = 64
STATE_SHAPE = (2, 128)
DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds


@dataclass
class _Sequence:
    state: np.ndarray  # [2, 128]
    context: np.ndarray  # [64]
    last_seen: float  # time.monotonic()


@dataclass
class _Work:
    """One parsed request waiting for its round."""

    index: int
    corrid: int
    start: bool
    end: bool
    audio: np.ndarray  # [512]
    state_in: np.ndarray | None
    context_in: np.ndarray | None


def _scalar(request: Any, name: str, default: int = 0) -> int:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


def _optional(request: Any, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return tensor.as_numpy().astype(np.float32, copy=False).reshape(shape)


def _error(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


def _outputs(prob: np.ndarray, state: np.ndarray, context: np.ndarray) -> Any:
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("probability", prob.reshape(1, 1).astype(np.float32)),
            pb_utils.Tensor(
                "state_out", np.ascontiguousarray(state.reshape(1, *STATE_SHAPE), np.float32)
            ),
            pb_utils.Tensor(
                "context_out", np.ascontiguousarray(context.reshape(1, CONTEXT), np.float32)
            ),
        ]
    )


class TritonPythonModel:
    """Sequence-batched Silero VAD; see the module docstring."""

    def initialize(self, args: dict[str, str]) -> None:
        # Relative to the (possibly temporary, e.g. S3-downloaded) repository copy.
        path = os.path.join(args["model_repository"], args["model_version"], "silero_vad.onnx")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            path, sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        config = json.loads(args["model_config"])
        idle_us = int(
            config.get("sequence_batching", {}).get("max_sequence_idle_microseconds")
            or DEFAULT_IDLE_US
        )
        idle_s = idle_us / 1e6
        # Grace period: our clock starts slightly after Triton's, never evict first.
        self._evict_after_s = idle_s + max(1.0, 0.1 * idle_s)
        self._sequences: dict[int, _Sequence] = {}

    def _evict_idle(self, now: float) -> None:
        stale = [
            cid for cid, seq in self._sequences.items() if now - seq.last_seen > self._evict_after_s
        ]
        for cid in stale:
            del self._sequences[cid]

    def _parse(self, index: int, request: Any) -> _Work | None:
        """None for a READY=0 filler (the ``direct`` strategy pads empty batch slots with them)."""
        if not _scalar(request, "READY", default=1):
            return None
        audio = pb_utils.get_input_tensor_by_name(request, "audio").as_numpy()
        if audio.shape != (1, CHUNK):
            raise ValueError(
                f"expected audio of shape [1, {CHUNK}] per request, got {list(audio.shape)}"
            )
        return _Work(
            index=index,
            corrid=_scalar(request, "CORRID"),
            start=bool(_scalar(request, "START")),
            end=bool(_scalar(request, "END")),
            audio=audio.reshape(CHUNK).astype(np.float32, copy=False),
            state_in=_optional(request, "state_in", STATE_SHAPE),
            context_in=_optional(request, "context_in", (CONTEXT,)),
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        now = time.monotonic()
        self._evict_idle(now)
        responses: list[Any] = [None] * len(requests)
        # Round k holds the k-th request of each sequence in this batch: within a
        # round every sequence appears at most once, and rounds run in order.
        rounds: list[list[_Work]] = []
        seen: dict[int, int] = {}
        for index, request in enumerate(requests):
            try:
                work = self._parse(index, request)
            except Exception as exc:  # noqa: BLE001 - a malformed request fails alone
                responses[index] = _error(f"silero_vad: {exc}")
                continue
            if work is None:  # filler: Triton discards its response, but one is required
                responses[index] = _outputs(np.zeros(1), np.zeros(STATE_SHAPE), np.zeros(CONTEXT))
                continue
            k = seen.get(work.corrid, 0)
            seen[work.corrid] = k + 1
            if k == len(rounds):
                rounds.append([])
            rounds[k].append(work)
        for batch in rounds:
            self._run_round(batch, responses, now)
        return responses

    def _run_round(self, batch: list[_Work], responses: list[Any], now: float) -> None:
        ready: list[tuple[_Work, np.ndarray, np.ndarray]] = []
        for work in batch:
            if work.start:
                state = (
                    work.state_in
                    if work.state_in is not None
                    else np.zeros(STATE_SHAPE, np.float32)
                )
                context = (
                    work.context_in
                    if work.context_in is not None
                    else np.zeros(CONTEXT, np.float32)
                )
            elif work.corrid in self._sequences:
                seq = self._sequences[work.corrid]
                state, context = seq.state, seq.context
            else:
                responses[work.index] = _error(
                    f"unknown sequence {work.corrid}: send START with state_in/context_in to resume"
                )
                continue
            ready.append((work, state, context))
        if not ready:
            return
        inputs = np.stack([np.concatenate([ctx, w.audio]) for w, _, ctx in ready])  # [B, 576]
        states = np.stack([st for _, st, _ in ready], axis=1)  # [2, B, 128]
        probs, states_n = self._session.run(
            ["output", "stateN"], {"input": inputs, "state": states, "sr": self._sr}
        )
        for i, (work, _, _) in enumerate(ready):
            state = np.array(states_n[:, i, :], dtype=np.float32)
            context = np.array(inputs[i, -CONTEXT:], dtype=np.float32)
            if work.end:
                self._sequences.pop(work.corrid, None)
            else:
                self._sequences[work.corrid] = _Sequence(state, context, now)
            responses[work.index] = _outputs(probs[i], state, context)

    def finalize(self) -> None:
        self._sequences.clear()
        self._session = None
