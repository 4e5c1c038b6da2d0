"""One step's outcomes: every request counted once, latency percentiles of the verified ones.

A benchmark that reports throughput over results nobody checked measures
nothing: a stage that dead-letters everything is very fast. So each request
ends in exactly one :class:`Outcome`, only ``VERIFIED`` ones enter the latency
percentiles and the throughput, and the others are shown as errors by kind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipeline.contract.errors import TextEnum
from pipeline.tools.summary import nearest_rank

PERCENTILES = (50, 90, 99)


class Outcome(TextEnum):
    """How one benchmark request ended."""

    VERIFIED = "verified"
    """A result with the request's correlation id, decoded, outputs of the right shapes."""
    DEAD_LETTER = "dead_letter"
    INVALID = "invalid"
    """A result that does not decode, or whose outputs are missing or misshapen."""
    MISSING = "missing"
    """No answer within the timeout."""
    SEND_FAILED = "send_failed"
    """The broker (or Triton, for a direct call) refused the request."""


@dataclass
class StepStats:
    """Counts and latencies of one path (pipeline or direct) at one step.

    Times are ``time.monotonic()`` seconds; latencies milliseconds.
    """

    outcomes: Counter[Outcome] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    first_error: str | None = None
    started: float | None = None
    """When the first request was sent."""
    finished: float | None = None
    """When the last request ended (its result, or its timeout)."""
    sending_s: float = 0.0
    """How long requests were being sent (the step's duration, unless interrupted)."""

    def sent(self, at: float) -> None:
        if self.started is None:
            self.started = at

    def ended(self, outcome: Outcome, at: float, latency_ms: float | None = None, error: str | None = None) -> None:
        self.outcomes[outcome] += 1
        self.finished = at if self.finished is None else max(self.finished, at)
        if outcome is Outcome.VERIFIED and latency_ms is not None:
            self.latencies_ms.append(latency_ms)
        elif error is not None and self.first_error is None:
            self.first_error = error

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    @property
    def verified(self) -> int:
        return self.outcomes[Outcome.VERIFIED]

    @property
    def errors(self) -> int:
        return self.requests - self.verified

    @property
    def elapsed_s(self) -> float:
        """First send to last outcome."""
        if self.started is None or self.finished is None:
            return 0.0
        return max(self.finished - self.started, 0.0)

    @property
    def throughput(self) -> float:
        """Verified results per second, over first send to last outcome."""
        elapsed = self.elapsed_s
        return self.verified / elapsed if elapsed > 0 else 0.0

    @property
    def send_rate(self) -> float:
        """Requests sent per second while sending (what an open loop achieved of its target)."""
        return self.requests / self.sending_s if self.sending_s > 0 else 0.0

    def percentiles(self) -> dict[str, float | None]:
        """``p50``, ``p90``, ``p99`` and ``max`` in ms (nearest rank), None without results."""
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return {**{f"p{p}": None for p in PERCENTILES}, "max": None}
        return {**{f"p{p}": nearest_rank(ordered, p) for p in PERCENTILES}, "max": ordered[-1]}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready numbers (``--json``)."""
        return {
            "requests": self.requests,
            "verified": self.verified,
            "errors": self.errors,
            "outcomes": {str(o): self.outcomes[o] for o in Outcome},
            "first_error": self.first_error,
            "elapsed_s": round(self.elapsed_s, 4),
            "throughput": round(self.throughput, 2),
            "send_rate": round(self.send_rate, 2),
            "latency_ms": {k: None if v is None else round(v, 3) for k, v in self.percentiles().items()},
        }
