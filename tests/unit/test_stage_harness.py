"""The stateless stage's own logic, in memory (tests/helpers/stage_harness.py): batching, the
failure policy, dead letters, output order and commits, with the real stage and outbox over a
scripted backend and fake Kafka clients. Milliseconds each; the broker and Triton paths keep
their integration tests."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.failure_policy import RetryPolicy
from tests.helpers.stage_harness import (
    DEAD_LETTERS,
    OUTPUT,
    Call,
    ScriptedBackend,
    StageHarness,
    Transient,
    feature_requests,
    stage_harness,
)
from workers.stateless.stage import BatchingSettings

WIDTH = 4  # features per row; request i's rows are all i, so its score is WIDTH * i


def fast(
    max_batch_size: int | None = 8, *, delay_s: float = 0.001, attempts: int = 3, inflight: int = 4
) -> BatchingSettings:
    """Millisecond queue delay and backoff: every wait in these tests is a few ms at most."""
    retry = RetryPolicy(max_attempts=attempts, initial_backoff_s=0.001, max_backoff_s=0.002)
    return BatchingSettings(
        max_batch_size=max_batch_size, max_queue_delay_s=delay_s, max_inflight_batches=inflight, retry=retry
    )


def ids(*numbers: int) -> tuple[str, ...]:
    return tuple(f"c{i}" for i in numbers)


def scores(h: StageHarness) -> dict[str, list[list[float]]]:
    return {r.correlation_id: r.outputs["scores"].tolist() for r in h.results()}


async def test_a_batch_of_n_requests_gives_n_results_in_input_order_and_commits_past_all() -> None:
    backend = ScriptedBackend()
    async with stage_harness(backend, fast()) as h:
        await h.feed(feature_requests(5, width=WIDTH))
        await h.pump()

        assert backend.calls == [Call(ids(0, 1, 2, 3, 4), 5, None)]  # one call for the fetch
        assert h.keys() == [(OUTPUT, f"c{i}") for i in range(5)]
        assert scores(h) == {f"c{i}": [[WIDTH * i]] for i in range(5)}  # each row back to its request
        assert h.dead_letters() == []
        assert h.committed() == 5


async def test_outputs_wait_for_earlier_records_when_a_later_batch_returns_first() -> None:
    backend = ScriptedBackend(script=[0.03, None])  # the first call is slow, the second not
    async with stage_harness(backend, fast(max_batch_size=2)) as h:
        await h.feed(feature_requests(4, width=WIDTH))
        await h.pump(lambda: len(backend.finished) == 1)
        assert backend.finished == [Call(ids(2, 3), 2, None)]
        assert h.producer.sent == [] and h.committed() is None  # held behind c0, c1

        await h.pump()
        assert h.keys() == [(OUTPUT, f"c{i}") for i in range(4)]
        assert h.committed() == 4


async def test_a_failing_row_splits_the_batch_and_only_its_request_is_dead_lettered() -> None:
    backend = ScriptedBackend(poison={"c2"})
    records = feature_requests(4, width=WIDTH)
    async with stage_harness(backend, fast()) as h:
        await h.feed(records)
        await h.pump()

        assert backend.calls == [
            Call(ids(0, 1, 2, 3), 4, "BadRow"),  # permanent: no retry of the batch, a split
            Call(ids(0), 1, None),
            Call(ids(1), 1, None),
            Call(ids(2), 1, "BadRow"),  # permanent for it alone: not retried either
            Call(ids(3), 1, None),
        ]
        assert h.keys() == [(OUTPUT, "c0"), (OUTPUT, "c1"), (DEAD_LETTERS, "c2"), (OUTPUT, "c3")]
        ((culprit, why),) = h.dead_letters()
        assert culprit == "c2" and why.stage == "classify"
        assert why.error_class == ErrorClass.INFERENCE_FAILED.value
        assert why.reason == "BadRow: model failed on row of c2"
        assert h.producer.sent[2].value == records[2].value  # the request, byte for byte
        assert scores(h) == {"c0": [[0.0]], "c1": [[WIDTH * 1.0]], "c3": [[WIDTH * 3.0]]}
        assert h.committed() == 4


async def test_a_transient_error_is_retried_up_to_max_attempts_then_dead_lettered() -> None:
    backend = ScriptedBackend(script=[Transient("queue full")] * 3)
    async with stage_harness(backend, fast(attempts=3)) as h:
        await h.feed(feature_requests(2, width=WIDTH))
        await h.pump()

        assert backend.calls == [Call(ids(0, 1), 2, "Transient")] * 3  # the batch whole, not split
        assert [(c, d.error_class, d.reason) for c, d in h.dead_letters()] == [
            (c, ErrorClass.MODEL_UNAVAILABLE.value, "gave up after 3 attempts: queue full") for c in ids(0, 1)
        ]
        assert h.committed() == 2

        await h.feed(feature_requests(1, width=WIDTH, first=2))  # the backend is fine again
        await h.pump()
        assert h.keys()[-1] == (OUTPUT, "c2") and h.committed() == 3


async def test_a_transient_error_that_clears_within_the_attempts_costs_nothing() -> None:
    backend = ScriptedBackend(script=[Transient("queue full")] * 2)
    async with stage_harness(backend, fast(attempts=3)) as h:
        await h.feed(feature_requests(2, width=WIDTH))
        await h.pump()

        assert [c.failed for c in backend.calls] == ["Transient", "Transient", None]
        assert h.keys() == [(OUTPUT, "c0"), (OUTPUT, "c1")] and h.committed() == 2


async def test_an_outage_dead_letters_nothing_and_results_follow_once_the_backend_is_back() -> None:
    backend = ScriptedBackend()
    backend.down = True
    async with stage_harness(backend, fast(attempts=2)) as h:
        await h.feed(feature_requests(3, width=WIDTH))
        await h.pump(lambda: len(backend.calls) >= 6)  # three times the attempts a transient error gets

        assert {c.failed for c in backend.calls} == {"Outage"}
        assert h.producer.sent == [] and h.committed() is None
        assert h.outbox.pending() == 3  # held, unacknowledged: replayed if the worker died now

        backend.down = False
        await h.pump()
        assert backend.calls[-1] == Call(ids(0, 1, 2), 3, None)  # the batch waited whole
        assert h.keys() == [(OUTPUT, f"c{i}") for i in range(3)]
        assert h.dead_letters() == [] and h.committed() == 3


async def test_records_handled_together_share_calls_of_at_most_max_batch_size() -> None:
    backend = ScriptedBackend()
    async with stage_harness(backend, fast(max_batch_size=4, delay_s=60.0)) as h:
        await h.feed(feature_requests(10, width=WIDTH))
        await h.pump()

        # Two full batches leave as they fill; the rest once the fetch is handled, a call slot
        # being free (work-conserving: no wait for the queue delay).
        assert [c.ids for c in backend.calls] == [ids(0, 1, 2, 3), ids(4, 5, 6, 7), ids(8, 9)]
        assert [c.rows for c in backend.calls] == [4, 4, 2]
        assert h.keys() == [(OUTPUT, f"c{i}") for i in range(10)] and h.committed() == 10


async def test_while_every_call_is_busy_later_fetches_fill_batches_and_a_freed_slot_takes_the_rest() -> None:
    backend = ScriptedBackend(script=[0.02])  # the first call is slow: the only call slot stays busy
    async with stage_harness(backend, fast(max_batch_size=4, delay_s=60.0, inflight=1)) as h:
        await h.feed(feature_requests(1, width=WIDTH))  # a free slot: it goes alone, at once
        await h.feed(feature_requests(1, width=WIDTH, first=1))
        await h.feed(feature_requests(5, width=WIDTH, first=2))
        await h.pump()

        # c1..c4 filled a batch while c0 ran; c5, c6 went when a slot was free, not after 60 s.
        assert [c.ids for c in backend.calls] == [ids(0), ids(1, 2, 3, 4), ids(5, 6)]
        assert h.keys() == [(OUTPUT, f"c{i}") for i in range(7)] and h.committed() == 7


async def test_with_hold_partial_batches_a_partial_batch_waits_its_queue_delay_though_a_call_is_free() -> None:
    backend = ScriptedBackend()
    settings = dataclasses.replace(fast(max_batch_size=4, delay_s=0.05), hold_partial_batches=True)
    async with stage_harness(backend, settings) as h:
        started = time.monotonic()
        await h.feed(feature_requests(6, width=WIDTH))
        await asyncio.sleep(0.01)
        assert [c.ids for c in backend.calls] == [ids(0, 1, 2, 3)]  # the full batch only

        await h.pump()
        assert [c.ids for c in backend.calls] == [ids(0, 1, 2, 3), ids(4, 5)]
        assert time.monotonic() - started >= 0.04  # c4, c5 waited out the delay
        assert h.keys() == [(OUTPUT, f"c{i}") for i in range(6)] and h.committed() == 6


async def test_rows_not_requests_fill_a_batch_and_each_request_gets_its_own_rows_back() -> None:
    backend = ScriptedBackend()
    async with stage_harness(backend, fast(max_batch_size=4)) as h:
        await h.feed(feature_requests(5, width=WIDTH, rows=2))
        await h.pump()

        assert [(c.ids, c.rows) for c in backend.calls] == [(ids(0, 1), 4), (ids(2, 3), 4), (ids(4), 2)]
        assert scores(h) == {f"c{i}": [[WIDTH * i]] * 2 for i in range(5)}


async def test_without_a_stage_limit_the_backends_own_max_batch_size_cuts_batches() -> None:
    backend = ScriptedBackend(max_batch_size=3)
    async with stage_harness(backend, fast(max_batch_size=None)) as h:
        await h.feed(feature_requests(7, width=WIDTH))
        await h.pump()
        assert [c.rows for c in backend.calls] == [3, 3, 1]


async def test_a_stage_limit_above_the_backends_is_refused_at_setup() -> None:
    with pytest.raises(BadRequest) as refused:
        async with stage_harness(ScriptedBackend(max_batch_size=4), fast(max_batch_size=8)):
            pass
    assert refused.value.error_class is ErrorClass.BATCH_TOO_LARGE


async def test_shutdown_finishes_running_and_waiting_batches_and_commits_past_them() -> None:
    backend = ScriptedBackend(script=[0.02])
    async with stage_harness(backend, fast(delay_s=60.0, inflight=1)) as h:
        await h.feed(feature_requests(1, width=WIDTH))  # running (slowly) when the shutdown starts
        await h.feed(feature_requests(2, width=WIDTH, first=1))  # the slot is busy: they wait in the batcher
        assert h.producer.sent == [] and h.outbox.pending() == 3

        await h.drain()  # release, flush, commit: no tick, no pump
        assert [c.ids for c in backend.calls] == [ids(0), ids(1, 2)]
        assert h.keys() == [(OUTPUT, f"c{i}") for i in range(3)] and h.committed() == 3
