"""Keyed state backed by a compacted Kafka topic (see :mod:`pipeline.state.store`).

Sequence stages keep one state per stream key, join stages one per correlation
ID; both use :class:`KeyedStateStore` and the one versioned checkpoint codec in
:mod:`pipeline.state.codec`.
"""

from pipeline.state.codec import CorruptState, StateCodec, decode_state, encode_state
from pipeline.state.store import KeyedStateStore, RestoreReport, StateEntry, StateLimits

__all__ = [
    "CorruptState",
    "KeyedStateStore",
    "RestoreReport",
    "StateCodec",
    "StateEntry",
    "StateLimits",
    "decode_state",
    "encode_state",
]
