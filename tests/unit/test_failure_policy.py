"""The one retry loop: outages wait without spending attempts, transient errors retry up
to ``max_attempts``, permanent errors give up at once, cancellation passes through."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.contract.errors import ErrorClass
from pipeline.failure_policy import Failure, FailureKind, GaveUp, RetryPolicy, call_with_retry

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)


class Scripted:
    """A call that fails with the given kinds in order, then returns "ok"."""

    def __init__(self, kinds: list[FailureKind]) -> None:
        self.kinds = list(kinds)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.kinds:
            raise RuntimeError(self.kinds.pop(0).value)
        return "ok"


async def classify(exc: BaseException) -> Failure:
    return Failure(FailureKind(str(exc)), ErrorClass.INFERENCE_FAILED, f"said {exc}")


async def test_outages_do_not_count_against_attempts() -> None:
    call = Scripted([FailureKind.OUTAGE] * 7 + [FailureKind.TRANSIENT] * 2)
    retries: list[FailureKind] = []
    assert await call_with_retry(call, classify, FAST, label="t", on_retry=lambda f: retries.append(f.kind)) == "ok"
    assert call.calls == 10 and retries.count(FailureKind.OUTAGE) == 7 and retries.count(FailureKind.TRANSIENT) == 2


async def test_transient_errors_give_up_after_max_attempts() -> None:
    call = Scripted([FailureKind.TRANSIENT] * 5)
    with pytest.raises(GaveUp) as raised:
        await call_with_retry(call, classify, FAST, label="t")
    assert call.calls == 3 and raised.value.attempts == 3
    assert raised.value.failure.reason == "gave up after 3 attempts: said transient"


async def test_permanent_errors_give_up_at_once() -> None:
    call = Scripted([FailureKind.PERMANENT])
    with pytest.raises(GaveUp) as raised:
        await call_with_retry(call, classify, FAST, label="t")
    assert call.calls == 1 and raised.value.failure.kind is FailureKind.PERMANENT
    assert raised.value.failure.reason == "said permanent"


async def test_cancellation_is_not_classified_or_retried() -> None:
    async def cancelled() -> str:
        raise asyncio.CancelledError

    async def must_not_classify(exc: BaseException) -> Failure:
        raise AssertionError("classified a cancellation")

    with pytest.raises(asyncio.CancelledError):
        await call_with_retry(cancelled, must_not_classify, FAST, label="t")


def test_backoff_is_capped_and_jittered_within_half_to_full() -> None:
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0)
    for attempt, cap in [(1, 0.1), (2, 0.2), (4, 0.8), (5, 1.0), (30, 1.0)]:
        waits = [policy.backoff(attempt) for _ in range(200)]
        assert all(cap / 2 <= w <= cap for w in waits), (attempt, min(waits), max(waits))
