"""A stream that changes owner, on a real Triton: a late frame of the old owner must not
reach the sequence the new owner drives.

The zombie case in miniature, without Kafka. Worker A drives a Silero VAD stream, then
stops between its fence check and its call (SIGSTOP at the wrong microsecond); worker B
takes the stream over from A's last checkpoint (START with the checkpointed state). When A
runs again, its admitted frame leaves. Each worker salts its sequence ids
(``SequenceModel.owner``), so that frame lands in A's own abandoned sequence, and B's
outputs are the uninterrupted stream's. The control shows the hazard is real: with one
unsalted id for both, the same late frame changes B's outputs (test_zombie_worker.py saw
this once in CI: 37 changed results of one stream).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pipeline.settings import TritonSettings
from tests.helpers.vad_reference import speech_with_silence, to_chunks
from workers.sequence.model import SequenceModel, StreamHandle
from workers.sequence.state import StreamState

pytestmark = [pytest.mark.triton]

STATE_MAP = {"state_in": "state_out", "context_in": "context_out"}
HANDED_OVER_AT = 40
"""Frames A applies before B takes over (in the speech: the VAD's state matters)."""


def _model(settings: TritonSettings) -> SequenceModel:
    return SequenceModel(settings, "silero_vad", model_input="audio", state_map=STATE_MAP)


async def _takeover(settings: TritonSettings, frames: list[np.ndarray], *, salted: bool) -> list[np.ndarray]:
    """B's probabilities for the frames after the handover, with A's late frame in between."""
    a, b = _model(settings), _model(settings)
    await a.setup("a")
    await b.setup("b")
    if not salted:
        b.owner = a.owner
    key = f"takeover-{a.owner.hex()}".encode()
    try:
        a_stream, a_work = StreamHandle(key), StreamState(key=key.decode())
        await a.infer_frames(a_stream, a_work, frames[:HANDED_OVER_AT], ending=False)
        checkpoint = a_work.copy()
        b_stream, b_work = StreamHandle(key), checkpoint.copy()
        first = await b.infer_frames(b_stream, b_work, frames[HANDED_OVER_AT : HANDED_OVER_AT + 1], ending=False)
        # A runs again: the frame it had admitted before it stopped leaves now.
        await a.infer_frames(a_stream, a_work, frames[HANDED_OVER_AT : HANDED_OVER_AT + 1], ending=False)
        rest = await b.infer_frames(b_stream, b_work, frames[HANDED_OVER_AT + 1 :], ending=True)
        return [np.asarray(o["probability"]) for o in first + rest]
    finally:
        await a.close()
        await b.close()


async def _uninterrupted(settings: TritonSettings, frames: list[np.ndarray]) -> list[np.ndarray]:
    model = _model(settings)
    await model.setup("reference")
    key = f"reference-{model.owner.hex()}".encode()
    try:
        outputs = await model.infer_frames(StreamHandle(key), StreamState(key=key.decode()), frames, ending=True)
        return [np.asarray(o["probability"]) for o in outputs[HANDED_OVER_AT:]]
    finally:
        await model.close()


def test_a_late_frame_of_a_streams_former_owner_changes_nothing_the_new_owner_computes(
    triton_settings: TritonSettings,
) -> None:
    frames = list(to_chunks(speech_with_silence(pad_s=0.5))[:120])
    reference = asyncio.run(_uninterrupted(triton_settings, frames))
    salted = asyncio.run(_takeover(triton_settings, frames, salted=True))
    unsalted = asyncio.run(_takeover(triton_settings, frames, salted=False))

    assert len(salted) == len(reference) == len(frames) - HANDED_OVER_AT
    np.testing.assert_allclose(np.concatenate(salted), np.concatenate(reference), rtol=1e-4, atol=1e-5)
    assert not np.allclose(np.concatenate(unsalted), np.concatenate(reference), rtol=1e-4, atol=1e-5), (
        "control: one sequence id for both owners should let the late frame change the new owner's outputs"
    )
