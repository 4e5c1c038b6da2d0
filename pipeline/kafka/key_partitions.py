"""The partition of many keyed records at once, as Kafka's default partitioner picks it.

Every Kafka client puts a keyed record on ``(murmur2(key) & 0x7fffffff) % partitions``
(the Java client's ``Utils.murmur2``; aiokafka's ``DefaultPartitioner``), so the same key
lands on the same partition whoever produces it: a stream's chunks and a correlation ID's
outputs stay together. aiokafka computes murmur2 in pure Python, one key at a time: 5 µs
for an 11-byte key, 12 µs for a 36-byte one, on this project's 2-core machine, which made
it one of the largest per-record costs of the outbox (issue 22). No maintained library
offers Kafka's murmur2 over many keys, so this module computes it over a whole emit pass
with numpy: the keys of one length form a matrix, and each of its 4-byte columns is one
vectorised mixing step (measured in ``tests/unit/test_key_partitions.py``'s docstring).

Same answers as aiokafka, key for key: the unit tests hold :func:`murmur2_many` to
``aiokafka.partitioner.murmur2`` on generated keys of every length class and to the Java
client's published test vectors. A record without a key is left to the caller (aiokafka
picks a random available partition for it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

_SEED = 0x9747B28C
_M = np.uint32(0x5BD1E995)
_R = np.uint32(24)


MEMO_KEYS = 4096
"""Hashes remembered per process (emptied when full). A sequence stage's outputs carry its
few streams' keys pass after pass: remembered, a pass needs no numpy at all (the vectorised
hash costs ~20 µs a pass however few keys it has; 2.4 % of the audio topology's CPU). A
stateless stage's correlation IDs never repeat: a miss costs two dictionary operations."""
_memo: dict[bytes, int] = {}


def murmur2_many(keys: Sequence[bytes]) -> np.ndarray:
    """Kafka's murmur2 of each key (uint32), in order."""
    memo = _memo
    known = [memo.get(key) for key in keys]
    if None not in known:
        return np.array(known, dtype=np.uint32)
    hashes = np.array([h or 0 for h in known], dtype=np.uint32)
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        if known[i] is None:
            by_length[len(key)].append(i)
    for length, positions in by_length.items():
        rows = np.frombuffer(b"".join(keys[i] for i in positions), dtype=np.uint8).reshape(len(positions), length)
        hashes[positions] = _murmur2_rows(rows, length)
    if len(memo) + len(keys) > MEMO_KEYS:
        memo.clear()
    memo.update(zip(keys, hashes.tolist(), strict=True))
    return hashes


def _murmur2_rows(rows: np.ndarray, length: int) -> np.ndarray:
    """murmur2 of each row of an ``(n, length)`` uint8 matrix (uint32 arithmetic wraps, as
    the Java client's int arithmetic does)."""
    n = rows.shape[0]
    h = np.full(n, _SEED ^ length, dtype=np.uint32)
    whole = length // 4
    if whole:
        words = np.ascontiguousarray(rows[:, : whole * 4]).view("<u4")  # little-endian, as Java reads them
        for column in range(whole):
            k = words[:, column] * _M
            k ^= k >> _R
            k *= _M
            h *= _M
            h ^= k
    tail = length % 4
    if tail:
        base = whole * 4
        if tail >= 3:
            h ^= rows[:, base + 2].astype(np.uint32) << np.uint32(16)
        if tail >= 2:
            h ^= rows[:, base + 1].astype(np.uint32) << np.uint32(8)
        h ^= rows[:, base].astype(np.uint32)
        h *= _M
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h


def key_partitions(keys: Sequence[bytes], all_partitions: Sequence[int]) -> list[int]:
    """The partition the default partitioner gives each key, of ``all_partitions`` in the
    order the producer's partitioner is given them (its cluster metadata's)."""
    if not keys:
        return []
    index = (murmur2_many(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(len(all_partitions))
    return [all_partitions[i] for i in index.tolist()]
