"""The one checkpoint format for keyed state: a versioned, self-describing JSON envelope.

``{"v": 2, "kind": "sequence", "state": {...}}``: ``kind`` names the state type
(so a record on the wrong topic is refused, not misread) and ``v`` the envelope
version. Each state type supplies a :class:`StateCodec` that turns its state into
plain JSON data and back; binary fields use :func:`pack_bytes` /
:func:`pack_array` (base64, float32 little-endian). Records written before the
envelope existed (sequence checkpoints ``{"v": 1, ...}``, join states without
``v``) are handed to the codec with their version, so it can read them.

JSON rather than a binary format because a checkpoint is small (a stream's carry
and recurrent state: a few KiB) and an operator can read it with any Kafka tool.
Anything that does not decode raises :class:`CorruptState`; the store decides what
to do with it (count, log, start the key fresh), never the caller's event loop.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any, Protocol, TypeVar

import numpy as np

ENVELOPE_VERSION = 2

S = TypeVar("S")


class CorruptState(ValueError):
    """A state record that cannot be decoded (wrong kind, bad JSON, missing fields)."""


class StateCodec(Protocol[S]):
    """How one kind of state becomes JSON data and back."""

    kind: str

    def to_dict(self, state: S) -> dict[str, Any]: ...

    def from_dict(self, data: dict[str, Any], version: int) -> S:
        """``version``: the envelope version the data came in (0 or 1: written before the
        envelope existed, in the state type's own older layout)."""


def encode_state(codec: StateCodec[S], state: S) -> bytes:
    envelope = {"v": ENVELOPE_VERSION, "kind": codec.kind, "state": codec.to_dict(state)}
    return json.dumps(envelope, separators=(",", ":")).encode()


def decode_state(codec: StateCodec[S], value: bytes) -> S:
    try:
        data = json.loads(value)
        if not isinstance(data, dict):
            raise CorruptState(f"a {codec.kind} state must be a JSON object")
        version = data.get("v", 0)
        if version == ENVELOPE_VERSION:
            if data.get("kind") != codec.kind:
                raise CorruptState(f"expected a {codec.kind!r} state, found {data.get('kind')!r}")
            return codec.from_dict(data["state"], version)
        if version in (0, 1):
            return codec.from_dict(data, version)
        raise CorruptState(f"unsupported state version {version!r}")
    except CorruptState:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise CorruptState(f"undecodable {codec.kind} state: {type(exc).__name__}: {exc}") from None


def payload_digest(payload: bytes) -> str:
    """A short digest of a record's bytes, kept in state to tell an exact replay from a
    different record with the same identity (a chunk index, a join branch)."""
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


def pack_bytes(value: bytes) -> str:
    return base64.b64encode(value).decode()


def unpack_bytes(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def pack_array(array: np.ndarray) -> dict[str, Any]:
    contiguous = np.ascontiguousarray(array, dtype="<f4")
    return {"shape": list(contiguous.shape), "f32": pack_bytes(contiguous.tobytes())}


def unpack_array(data: dict[str, Any]) -> np.ndarray:
    raw = unpack_bytes(data["f32"])
    return np.frombuffer(raw, dtype="<f4").reshape(data["shape"]).astype(np.float32)
