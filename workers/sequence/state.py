"""One stream's progress, its checkpoint codec, and framing.

Everything a stream's next output depends on lives in :class:`StreamState`: the
next chunk index, the samples carried over to the next frame, the model's
recurrent state (its state outputs, fed back as state inputs on resume), the
post-processor's own state (e.g. the VAD segment tracker), and digests of
recently applied chunks (to tell an exact duplicate from a conflicting one).
The stage checkpoints it through :class:`pipeline.state.KeyedStateStore` after
the results it accounts for are acknowledged, so a worker that restores it
continues exactly where the checkpoint left off.

Pure data and logic: no I/O, unit-tested on its own.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pipeline.state.codec import pack_array, payload_digest, unpack_array

DIGEST_MEMORY = 64  # applied chunks remembered per stream for duplicate detection
SKIPPED_MEMORY = 16  # gap ranges remembered per stream


@dataclass
class StreamState:
    """One stream's progress; see the module docstring for why each field exists."""

    key: str
    next_index: int = 0
    frames_done: int = 0
    samples_in: int = 0
    carry: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    model_state: dict[str, np.ndarray] = field(default_factory=dict)
    post: dict[str, Any] = field(default_factory=dict)
    """The post-processor's JSON-able state (replaced, never changed in place)."""
    ended: bool = False
    digests: OrderedDict[int, str] = field(default_factory=OrderedDict)
    last_ms: int = 0
    """Event time (record timestamp) of the last chunk applied: idleness is judged by it."""
    skipped: list[tuple[int, int]] = field(default_factory=list)
    """The last ``SKIPPED_MEMORY`` ranges [start, stop) of chunk indices the stream went on
    without (a gap): such a chunk arriving late is dead-lettered, not mistaken for a replay."""
    first_digest: str | None = None
    """Digest of chunk 0, kept for the stream's life: after the stream ended, chunk 0 with
    sequence_start again is a replay when it matches, else the key's next stream."""

    def copy(self) -> StreamState:
        """A copy to work on: arrays and the post dict are replaced, never changed in
        place, so only the containers are copied (a deepcopy costs ~8x more per chunk)."""
        return replace(self, model_state=dict(self.model_state), digests=OrderedDict(self.digests))

    def remember(self, index: int, payload: bytes) -> None:
        self.digests[index] = payload_digest(payload)
        if index == 0:
            self.first_digest = self.digests[0]
        while len(self.digests) > DIGEST_MEMORY:
            self.digests.popitem(last=False)

    def skip(self, start: int, stop: int) -> None:
        """The stream goes on without chunks ``start`` to ``stop - 1`` (a range: it may be huge)."""
        self.skipped.append((start, stop))
        del self.skipped[:-SKIPPED_MEMORY]
        self.next_index = stop

    def was_skipped(self, index: int) -> bool:
        return any(start <= index < stop for start, stop in self.skipped)

    def is_exact_duplicate(self, index: int, payload: bytes) -> bool | None:
        """True/False for a remembered index; None when it is too old to tell."""
        digest = self.digests.get(index)
        if digest is None:
            return None
        return digest == payload_digest(payload)


class StreamStateCodec:
    """:class:`pipeline.state.StateCodec` for stream states (kind ``sequence``)."""

    kind = "sequence"

    #: Fields stored as they are (JSON-ready); the others are packed below.
    plain_fields = ("key", "next_index", "frames_done", "samples_in", "post", "ended", "last_ms", "first_digest")

    def to_dict(self, state: StreamState) -> dict[str, Any]:
        return {name: getattr(state, name) for name in self.plain_fields} | {
            "carry": pack_array(state.carry),
            "model_state": {name: pack_array(a) for name, a in state.model_state.items()},
            "digests": [[i, d] for i, d in state.digests.items()],
            "skipped": [list(r) for r in state.skipped],
        }

    def from_dict(self, data: dict[str, Any], version: int) -> StreamState:
        post = data.get("post", {}) if version >= 2 else _v1_post(data)
        return StreamState(
            key=str(data["key"]),
            next_index=int(data["next_index"]),
            frames_done=int(data["frames_done"]),
            samples_in=int(data["samples_in"]),
            carry=unpack_array(data["carry"]),
            model_state={name: unpack_array(a) for name, a in data["model_state"].items()},
            post=dict(post),
            ended=bool(data["ended"]),
            digests=OrderedDict((int(i), str(d)) for i, d in data["digests"]),
            last_ms=int(data.get("last_ms", 0)),
            skipped=[(int(a), int(b)) for a, b in data.get("skipped", [])],
            first_digest=data.get("first_digest"),
        )


def _v1_post(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 kept the VAD tracker's fields at the top level."""
    if data.get("tracker") is None and not data.get("segments") and not data.get("speech_frames"):
        return {}
    return {
        "tracker": data.get("tracker"),
        "segments": int(data.get("segments", 0)),
        "speech_frames": int(data.get("speech_frames", 0)),
    }


def frame(carry: np.ndarray, samples: np.ndarray, size: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Split ``carry + samples`` into whole frames of ``size`` and the new carry."""
    joined = np.concatenate([carry, samples.astype(np.float32, copy=False)]) if carry.size else samples
    joined = np.asarray(joined, dtype=np.float32)
    whole = (joined.size // size) * size
    frames = [joined[i : i + size] for i in range(0, whole, size)]
    return frames, joined[whole:].copy()
