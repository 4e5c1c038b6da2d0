"""Plain settings of a sequence stage (built from the topology by the stage registry)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pipeline.failure_policy import RetryPolicy
from pipeline.kafka.progress import DEFAULT_GONE_AFTER_S, Upstream
from workers.sequence.checkpoints import CheckpointPolicy
from workers.sequence.postprocess import VadSettings


@dataclass(frozen=True)
class SequenceSettings:
    model: str
    model_version: str = ""
    input_tensor: str = "audio"
    """Request tensor with the stream's new samples; framed into the model's window."""
    model_input: str | None = None
    """Model input the frames go to; None = the model's first non-optional input."""
    state_map: Mapping[str, str] = field(default_factory=dict)
    """Model state input -> the output that feeds it (checkpointed, sent back on resume)."""
    sample_rate: int = 16_000
    """Samples per second of the incoming audio (segment times and durations)."""
    idle_timeout_s: float | None = None
    """None: the model's max_sequence_idle_microseconds (60 s when it has none)."""
    max_inflight_requests: int = 64
    reorder_window: int = 16
    gap_timeout_s: float = 5.0
    gap_policy: Literal["skip", "fail"] = "skip"
    """A chunk still missing after gap_timeout_s, or when later chunks overflow the reorder
    window: ``skip`` it (a ``gap`` result marks it, the stream goes on) or ``fail`` the stream."""
    max_chunk_seconds: float = 10.0
    """Longest chunk accepted (bounds the frames, so the Triton calls, one record costs)."""
    ended_retention_s: float = 600.0
    max_streams: int | None = None
    """Live streams one worker holds; beyond it the idlest are closed ("evicted")."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    call_timeout_s: float = 30.0
    """Client deadline of one Triton call (a hung Triton times out into an outage wait)."""
    vad: VadSettings | None = None
    """The ``vad_segments`` post-processor's settings; None: chunk results only."""
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    """How many applied chunks one checkpoint of a stream covers (``checkpoints.checkpoint_due``)."""
    upstream: tuple[Upstream, ...] = ()
    """The stages before this one in the chain: a stream is idle only once they are caught up or gone."""
    upstream_gone_after_s: float = DEFAULT_GONE_AFTER_S
    """No live member in an upstream group this long: it is gone."""
