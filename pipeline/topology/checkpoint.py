"""How often a sequence stage checkpoints a stream (``checkpoint:`` on a sequence stage).

Kept apart from :mod:`pipeline.topology.model` so the sequence stage's one new setting
does not grow that module. The rule it configures is
:func:`workers.sequence.checkpoints.checkpoint_due`; docs/streaming.md argues why coalesced
checkpoints keep crash consistency.
"""

from __future__ import annotations

from pydantic import Field, PositiveInt

from pipeline.topology.fields import _Strict

#: Chunk digests a stream remembers (``workers.sequence.state``): a replay is recognised
#: byte for byte only within them, so a checkpoint never covers more chunks than that.
MAX_EVERY_CHUNKS = 64


class CheckpointConfig(_Strict):
    """One checkpoint per stream for every ``every_chunks`` chunks applied together, or
    sooner: when the stream has no further chunk on hand, when it ends, or when its oldest
    uncheckpointed chunk is ``max_interval_ms`` old. Results still leave per chunk; only the
    input offset waits for the checkpoint (a crash replays and re-applies the chunks after it)."""

    every_chunks: PositiveInt = Field(default=16, le=MAX_EVERY_CHUNKS)
    """Most chunks one checkpoint covers; 1 = a checkpoint per chunk."""
    max_interval_ms: PositiveInt = 200
    """Longest a stream's applied chunks wait for their checkpoint (bounds how far the
    committed offset trails, hence how much a crash replays)."""
