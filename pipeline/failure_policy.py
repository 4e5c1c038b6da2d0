"""What to do when a backend call fails: the outcome types and the one retry loop.

Every stage that calls something that can fail (a Triton model in a batching
stage, Triton's sequence batcher, a DALI run) lets that thing *classify* the
error and then applies the same policy, here:

- ``OUTAGE``: the server is down, starting, shutting down, or a model is being
  (re)loaded. Not the request's fault: wait with backoff, for as long as it
  takes (the caller holds its in-flight slot, so the consumer pauses and memory
  stays bounded), and do not count the wait against the request's attempts.
- ``TRANSIENT``: a live server said "not now" (queue full, timeout): retry with
  backoff up to ``RetryPolicy.max_attempts``; then give up.
- ``PERMANENT``: this request (or one in the batch) is the problem: give up at
  once; a batching caller then retries request by request to find the culprit.

The loop itself is tenacity's (:class:`tenacity.AsyncRetrying`); this module
only supplies the classification-driven retry/stop/wait decisions, so the
counting rules above live in one place.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState

from pipeline.contract.errors import ErrorClass

log = logging.getLogger(__name__)

T = TypeVar("T")


class FailureKind(enum.Enum):
    OUTAGE = "outage"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


@dataclass(frozen=True)
class Failure:
    """How the caller should treat one error, and what to write in a dead letter."""

    kind: FailureKind
    error_class: ErrorClass
    """The dead letter's ``error-class`` if the record ends there."""
    reason: str
    """One line for the ``error-reason`` header and the log."""


class GaveUp(Exception):
    """The policy stopped trying: ``failure`` says why (a permanent error, or the last
    transient one once ``attempts`` were spent)."""

    def __init__(self, failure: Failure, attempts: int) -> None:
        super().__init__(failure.reason)
        self.failure = failure
        self.attempts = attempts


Classifier = Callable[[BaseException], Awaitable[Failure]]
OnRetry = Callable[[Failure], None]


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for outages and transient errors; attempts for transient errors."""

    max_attempts: int = 5
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with equal jitter (attempt counts from 1): uniform in
        [cap/2, cap], so retries spread out but never come back at once."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * (2 ** (max(attempt, 1) - 1)))
        return random.uniform(cap / 2, cap)


class _Decisions:
    """The retry/stop/wait callbacks of one call, sharing what the classifier said."""

    OUTAGE_WAIT_CAP = 10  # outage backoff stops growing after this many waits

    def __init__(self, classify: Classifier, policy: RetryPolicy, label: str, on_retry: OnRetry | None) -> None:
        self.classify = classify
        self.policy = policy
        self.label = label
        self.on_retry = on_retry
        self.last: Failure | None = None
        self.attempts = 0  # failed attempts that count (transient and permanent)
        self.outages = 0

    async def retry(self, state: RetryCallState) -> bool:
        assert state.outcome is not None
        exc = state.outcome.exception()
        if exc is None or not isinstance(exc, Exception):
            return False  # a result, or cancellation: never retried
        failure = self.last = await self.classify(exc)
        if failure.kind is FailureKind.OUTAGE:
            self.outages += 1
            if self.outages == 1 or self.outages % 20 == 0:
                log.warning("%s unavailable (%s); waiting", self.label, failure.reason)
            return True
        self.attempts += 1
        return failure.kind is FailureKind.TRANSIENT

    def stop(self, state: RetryCallState) -> bool:
        failure = self.last
        return (
            failure is not None and failure.kind is FailureKind.TRANSIENT and self.attempts >= self.policy.max_attempts
        )

    def wait(self, state: RetryCallState) -> float:
        if self.last is not None and self.last.kind is FailureKind.OUTAGE:
            return self.policy.backoff(min(self.outages, self.OUTAGE_WAIT_CAP))
        return self.policy.backoff(self.attempts)

    def before_sleep(self, state: RetryCallState) -> None:
        if self.on_retry is not None and self.last is not None:
            self.on_retry(self.last)


async def call_with_retry(
    call: Callable[[], Awaitable[T]],
    classify: Classifier,
    policy: RetryPolicy,
    *,
    label: str,
    on_retry: OnRetry | None = None,
) -> T:
    """Run ``call`` until it succeeds or the policy gives up (:class:`GaveUp`).

    ``classify`` turns each exception into a :class:`Failure`; ``on_retry`` is told
    before every wait (metrics). Cancellation passes straight through.

    The first attempt runs before any of the loop is built: nearly every call succeeds
    at once, and tenacity's loop costs about 20 µs per call, 7 % of a sequence stage's CPU
    (one call per audio frame; ``benchmarks.audio --profile``). When it fails, the loop
    starts with that failure as its first attempt, so every decision is the loop's.
    """
    try:
        return await call()
    except Exception as exc:  # noqa: BLE001 - every failure is the classifier's to judge, in the loop below
        first: Exception | None = exc

    async def attempts() -> T:
        nonlocal first
        if first is not None:
            failed, first = first, None
            raise failed
        return await call()

    decisions = _Decisions(classify, policy, label, on_retry)
    retrying = AsyncRetrying(
        retry=decisions.retry,
        stop=decisions.stop,
        wait=decisions.wait,
        before_sleep=decisions.before_sleep,
        reraise=True,
    )
    try:
        return await retrying(attempts)
    except Exception as exc:
        failure = decisions.last or await classify(exc)
        if failure.kind is FailureKind.TRANSIENT:
            reason = f"gave up after {decisions.attempts} attempts: {failure.reason}"
            failure = Failure(failure.kind, failure.error_class, reason)
        raise GaveUp(failure, decisions.attempts) from exc
