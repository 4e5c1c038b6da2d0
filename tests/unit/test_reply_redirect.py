"""The reply-topic rule (pure) and the client's matching of replies to calls."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.client.waiters import Delivery, Waiters
from pipeline.contract.records import DeadLetter
from pipeline.contract.reply import ReplyOutcome, reply_headers, reply_prefix, reply_target
from pipeline.kafka.outbox import OutRecord
from pipeline.kafka.replies import ReplyRedirector
from pipeline.tools.decoding import Consumed, Kind
from pipeline.tools.sources import audio_chunk

PREFIX = reply_prefix("dense.results")


def _target(*pairs: tuple[str, str]) -> tuple[ReplyOutcome | None, str | None, int | None]:
    route = reply_target([(k, v.encode()) for k, v in pairs], PREFIX)
    return route.outcome, route.topic, route.partition


def test_prefix_is_the_result_topic_and_reply() -> None:
    assert PREFIX == "dense.results.reply."


@pytest.mark.parametrize(
    ("pairs", "want"),
    [
        ((), (None, None, None)),
        ((("reply-topic", "dense.results.reply.c1"),), (ReplyOutcome.HONOURED, "dense.results.reply.c1", None)),
        ((("Reply-Topic", "dense.results.reply.c1"), ("reply-partition", "3")),
         (ReplyOutcome.HONOURED, "dense.results.reply.c1", 3)),
        ((("reply-topic", "dense.results.reply."),), (ReplyOutcome.OUTSIDE_PREFIX, "dense.results.reply.", None)),
        ((("reply-topic", "dense.requests"),), (ReplyOutcome.OUTSIDE_PREFIX, "dense.requests", None)),
        ((("reply-topic", "__consumer_offsets"),), (ReplyOutcome.OUTSIDE_PREFIX, "__consumer_offsets", None)),
        ((("reply-topic", "dense.results.reply.a/b"),), (ReplyOutcome.BAD_HEADER, None, None)),
        ((("reply-topic", "dense.results.reply." + "x" * 240),), (ReplyOutcome.BAD_HEADER, None, None)),
        ((("reply-topic", "dense.results.reply.c1"), ("reply-partition", "-1")),
         (ReplyOutcome.BAD_HEADER, "dense.results.reply.c1", None)),
        ((("reply-topic", "dense.results.reply.c1"), ("reply-partition", "99999999999")),
         (ReplyOutcome.BAD_HEADER, "dense.results.reply.c1", None)),
        ((("reply-topic", "dense.results.reply.a"), ("reply-topic", "dense.results.reply.b")),
         (ReplyOutcome.BAD_HEADER, None, None)),
    ],
)
def test_reply_target(pairs: tuple[tuple[str, str], ...], want: tuple[object, ...]) -> None:
    assert _target(*pairs) == want


def test_non_utf8_reply_topic_is_a_bad_header() -> None:
    assert reply_target([("reply-topic", b"\xff")], PREFIX).outcome is ReplyOutcome.BAD_HEADER


def test_reply_headers_round_trip() -> None:
    route = reply_target(reply_headers("dense.results.reply.c1", 0), PREFIX)
    assert route.honoured and route.partition == 0


def _reply(cid: str, *, key: bytes | None = None, dead: bool = False) -> Consumed:
    return Consumed(
        topic="t", partition=0, offset=0, timestamp_ms=0, key=key or cid.encode(), value=b"", headers=[],
        kind=Kind.DEAD_LETTER if dead else Kind.RESULT, correlation_id=cid,
        dead_letter=DeadLetter("classify", "unknown-input", "no", None) if dead else None,
    )


def test_waiters_deliver_once_and_count_late_duplicate_and_foreign() -> None:
    async def scenario() -> None:
        waiters = Waiters()
        answered, failed = waiters.expect("a"), waiters.expect("b")
        waiters.expect("c")
        assert waiters.deliver(_reply("a")) is Delivery.DELIVERED
        assert answered.result().correlation_id == "a"
        assert waiters.deliver(_reply("b", dead=True)) is Delivery.DELIVERED and failed.result().dead_letter
        waiters.give_up("c", timed_out=True)
        assert waiters.deliver(_reply("c")) is Delivery.LATE
        assert waiters.deliver(_reply("a")) is Delivery.DUPLICATE
        # A replay after a crash may dead-letter an answered request (deadline): the first outcome stands.
        assert waiters.deliver(_reply("a", dead=True)) is Delivery.DUPLICATE and not answered.result().dead_letter
        assert waiters.deliver(_reply("someone-else")) is Delivery.FOREIGN
        stats = waiters.stats
        assert (stats.results, stats.dead_letters, stats.timed_out) == (1, 1, 1)
        assert (stats.late, stats.duplicates, stats.foreign) == (1, 2, 1)
        with pytest.raises(ValueError):
            waiters.expect("d") and waiters.expect("d")

    asyncio.run(scenario())


def test_a_reply_racing_a_cancelled_call_is_late_not_foreign() -> None:
    async def scenario() -> None:
        waiters = Waiters()
        waiters.expect("a").cancel()  # wait_for cancelled the call; give_up() has not run yet
        assert waiters.deliver(_reply("a")) is Delivery.LATE
        waiters.give_up("a", timed_out=True)
        assert waiters.stats.late == 1 and waiters.stats.timed_out == 1 and waiters.stats.foreign == 0

    asyncio.run(scenario())


def test_stream_replies_go_to_the_stream_by_key() -> None:
    async def scenario() -> None:
        waiters = Waiters()
        queue = waiters.open_stream(b"s1")
        assert waiters.deliver(_reply("x/0", key=b"s1")) is Delivery.STREAMED
        assert queue.get_nowait().correlation_id == "x/0"
        waiters.close_stream(b"s1")
        assert waiters.deliver(_reply("x/1", key=b"s1")) is Delivery.FOREIGN

    asyncio.run(scenario())


def test_waiters_forget_the_oldest_settled_ids() -> None:
    async def scenario() -> None:
        waiters = Waiters(settled_memory=2)
        for cid in "abc":
            waiters.expect(cid)
            waiters.give_up(cid, timed_out=True)
        assert waiters.deliver(_reply("a")) is Delivery.FOREIGN
        assert waiters.deliver(_reply("c")) is Delivery.LATE

    asyncio.run(scenario())


def test_audio_chunk_sets_the_sequence_flags_and_shape() -> None:
    first = audio_chunk(np.zeros(512, np.float32), index=0, stream="s", end=False, sample_rate=16000)
    assert first.inputs["audio"].shape == (512, 1) and first.datatypes == {"audio": "FP32"}
    assert first.parameters == {
        "chunk_index": 0, "sequence_id": "s", "sequence_start": True, "sequence_end": False, "sample_rate": 16000,
    }
    last = audio_chunk(np.zeros((4, 2), np.int16), index=7, stream="s", end=True, sample_rate=8000, as_wav=True)
    assert last.datatypes == {"audio": "BYTES"} and last.inputs["audio"][0][:4] == b"RIFF"
    assert last.parameters["sequence_end"] is True and last.parameters["sequence_start"] is False


def test_a_result_its_reply_topic_refused_goes_back_to_the_result_topic_and_the_topic_counts_as_missing() -> None:
    """The broker refused a result at its reply topic (deleted: its client is gone). The
    outbox hands it back (``redirect_back``): it goes to the result topic it was bound for, and
    later results asking for that topic go there at once, before any metadata lookup.
    (Real Kafka refuses a send to a deleted topic; Tansu, the suite's broker, creates it
    again, so the integration tests cannot show it.)"""
    counted: list[ReplyOutcome] = []
    router = ReplyRedirector(cast(Any, None), result_topic="t.results", prefix="t.results.reply.", on_outcome=counted.append)
    reply = "t.results.reply.gone"
    sent = OutRecord(topic=reply, key=b"k", value=b"v", headers=[], partition=0, redirected_from=("t.results", None))
    checkpoint = OutRecord(topic="t.state", key=b"k", value=b"s", headers=[], after_acks=True, counts_as_result=False)

    back = asyncio.run(router.redirect_back((sent, checkpoint)))

    assert back[0].topic == "t.results" and back[0].partition is None and back[0].redirected_from is None
    assert back[1] is checkpoint
    assert counted == [ReplyOutcome.UNREACHABLE]
    later = OutRecord(topic="t.results", key=b"k2", value=b"v2", headers=reply_headers(reply))
    assert asyncio.run(router.redirect(later)) is later  # no producer needed: known missing
    assert counted == [ReplyOutcome.UNREACHABLE, ReplyOutcome.UNKNOWN_TOPIC]


_HEADER_NAMES = st.sampled_from(["reply-topic", "Reply-Topic", "reply-partition", "REPLY-PARTITION", "correlation-id", "x"])
_HEADER_VALUES = st.sampled_from([b"t.results.reply.a", b"t.results.reply.", b"other", b"1", b"-1", b"", None])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=5),
    st.sampled_from(["t.results", "t.other"]),
    st.booleans(),
)
def test_an_output_the_quick_look_passes_over_is_one_redirect_leaves_alone(
    headers: list[tuple[str, bytes | None]], topic: str, dead_letter: bool
) -> None:
    """``asks`` (one pass over the headers, no coroutine) is False only where ``redirect``
    would return the output unchanged and count no outcome."""
    counted: list[ReplyOutcome] = []
    router = ReplyRedirector(cast(Any, _NoTopics()), result_topic="t.results", prefix="t.results.reply.", on_outcome=counted.append)
    out = OutRecord(topic=topic, key=b"k", value=b"v", headers=cast(Any, headers), dead_letter=dead_letter)
    if not router.asks(out):
        assert asyncio.run(router.redirect(out)) is out
        assert counted == []


class _NoTopics:
    """A producer whose metadata knows no reply topic (a redirect then counts unknown-topic)."""

    class client:
        class cluster:
            @staticmethod
            def partitions_for_topic(_topic: str) -> None:
                return None

        @staticmethod
        async def force_metadata_update() -> bool:
            return False
