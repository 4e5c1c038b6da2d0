"""Stream state: framing, segment hysteresis, duplicate detection, checkpoint round trip."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.state import decode_state, encode_state
from workers.sequence.postprocess import Segment, SegmentTracker
from workers.sequence.state import StreamState, StreamStateCodec, frame

CODEC = StreamStateCodec()


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 2000), min_size=1, max_size=20))
def test_framing_any_chunk_sizes_equals_framing_the_whole(sizes: list[int]) -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    carry = np.zeros(0, np.float32)
    frames: list[np.ndarray] = []
    for chunk in chunks:
        new, carry = frame(carry, chunk, 512)
        frames.extend(new)
    whole = np.concatenate(chunks)
    n = len(whole) // 512
    assert len(frames) == n
    if n:
        np.testing.assert_array_equal(np.stack(frames), whole[: n * 512].reshape(n, 512))
    np.testing.assert_array_equal(carry, whole[n * 512 :])


def _tracker() -> SegmentTracker:
    return SegmentTracker(threshold=0.5, neg_threshold=0.35, min_speech_frames=3, min_silence_frames=2)


def test_tracker_opens_closes_and_ignores_short_blips() -> None:
    tracker = _tracker()
    probs = [0.1, 0.9, 0.1, 0.1, 0.1, 0.1] + [0.1, 0.8, 0.9, 0.9, 0.6, 0.2, 0.45, 0.1, 0.1, 0.1]
    closed = [s for i, p in enumerate(probs) if (s := tracker.push(i, p))]
    # frame 1 alone is too short; frames 7..10 speech (0.45 is between thresholds: not silence yet)
    assert closed == [Segment(7, 11)]


def test_tracker_finish_closes_an_open_segment() -> None:
    tracker = _tracker()
    for i, p in enumerate([0.1, 0.9, 0.9, 0.9, 0.9]):
        assert tracker.push(i, p) is None
    assert tracker.finish(5) == Segment(1, 5)
    assert tracker.finish(5) is None


def test_tracker_state_round_trips_mid_segment() -> None:
    a, b = _tracker(), _tracker()
    probs = [0.9, 0.9, 0.9, 0.2, 0.2, 0.2, 0.9]
    for i, p in enumerate(probs[:4]):
        a.push(i, p)
    b.restore(a.to_dict())
    rest_a = [a.push(i, p) for i, p in enumerate(probs[4:], start=4)]
    rest_b = [b.push(i, p) for i, p in enumerate(probs[4:], start=4)]
    assert rest_a == rest_b and Segment(0, 3) in rest_a


def test_checkpoint_round_trip_is_exact() -> None:
    state = StreamState(key="stream-7", next_index=12, frames_done=30, samples_in=15_000)
    state.carry = np.random.default_rng(1).standard_normal(100).astype(np.float32)
    state.model_state = {
        "state_out": np.random.default_rng(2).standard_normal((2, 128)).astype(np.float32),
        "context_out": np.random.default_rng(3).standard_normal(64).astype(np.float32),
    }
    state.post = {"tracker": {"triggered": True, "start": 20, "temp_end": None}, "segments": 2}
    for i in range(70):
        state.remember(i, f"chunk-{i}".encode())
    back = decode_state(CODEC, encode_state(CODEC, state))
    assert back.key == "stream-7" and back.next_index == 12 and back.frames_done == 30
    np.testing.assert_array_equal(back.carry, state.carry)
    for name in state.model_state:
        np.testing.assert_array_equal(back.model_state[name], state.model_state[name])
    assert back.post == state.post
    assert back.digests == state.digests and len(back.digests) == 64


def test_duplicate_detection() -> None:
    state = StreamState(key="k")
    state.remember(3, b"payload")
    assert state.is_exact_duplicate(3, b"payload") is True
    assert state.is_exact_duplicate(3, b"other") is False
    assert state.is_exact_duplicate(2, b"payload") is None


def test_version_1_checkpoint_is_read_with_its_vad_fields_as_post_state() -> None:
    """Checkpoints written before the versioned envelope still restore (no stream restarts)."""
    v1 = (
        b'{"v":1,"key":"s","next_index":3,"frames_done":5,"samples_in":2600,'
        b'"carry":{"shape":[0],"f32":""},"model_state":{},'
        b'"tracker":{"triggered":true,"start":2,"temp_end":null},"segments":1,"speech_frames":4,'
        b'"ended":false,"digests":[[2,"ab"]]}'
    )
    state = decode_state(CODEC, v1)
    assert (state.key, state.next_index, state.frames_done, state.samples_in) == ("s", 3, 5, 2600)
    assert state.post == {"tracker": {"triggered": True, "start": 2, "temp_end": None}, "segments": 1, "speech_frames": 4}
    assert dict(state.digests) == {2: "ab"}
