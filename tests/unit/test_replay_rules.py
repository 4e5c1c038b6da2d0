"""`pipeline replay`'s pure rules: filters, times, the replay bound, the headers a replay sends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest

from pipeline.contract.records import (
    ClaimCheck,
    claim_check_headers,
    dead_letter_headers,
    read_replay_count,
    read_source,
    replayed_headers,
    source_position_headers,
)
from pipeline.deadletter.claim_check import (
    ClaimCheckMismatch,
    ClaimName,
    manifest,
    manifest_key,
    parse_manifest,
)
from pipeline.errors import ConfigError
from pipeline.tools.replay_rules import Letter, ReplayFilter, ReplayRules, Verdict, parse_time
from workers.runtime.dead_letters import dead_letter_of

NOW = 1_700_000_000_000
ORIGINAL: list[tuple[str, bytes | None]] = [
    ("content-type", b"application/json"),
    ("correlation-id", b"c-1"),
    ("app", b"\x00\xff"),  # not UTF-8: kept as bytes
    ("nothing", None),  # a null header value: kept as null
]


@dataclass(frozen=True)
class FakeRecord:
    """A consumed record's shape (pipeline.kafka.records.ConsumedRecord) for the rules."""

    headers: list[tuple[str, bytes]] = field(default_factory=list)
    key: bytes | None = b"c-1"
    value: bytes | None = b"{}"
    topic: str = "t.dead-letters"
    partition: int = 0
    offset: int = 7
    timestamp: int = NOW - 3_600_000


def _dead(
    original: Sequence[tuple[str, bytes | None]] = ORIGINAL,
    *,
    error_class: str = "unknown-model",
    stage: str = "classify",
    time_ms: int = NOW - 60_000,
    source: str | None = "t.requests",
) -> list[tuple[str, bytes]]:
    kept = list(original) + (source_position_headers(source, 2, 41) if source else [])
    return dead_letter_headers(kept, stage=stage, error_class=error_class, reason="why", now_ms=time_ms)


def _letter(headers: list[tuple[str, bytes]], key: bytes | None = b"c-1") -> Letter:
    return Letter.of(FakeRecord(headers=headers, key=key))


# ------------------------------------------------------------------ times


@pytest.mark.parametrize(
    ("text", "ago_ms"), [("10m", 600_000), ("2h", 7_200_000), ("1d", 86_400_000), ("30s", 30_000), ("1.5s", 1_500), ("250ms", 250)]
)
def test_relative_times_count_back_from_now(text: str, ago_ms: int) -> None:
    assert parse_time(text, now_ms=NOW) == NOW - ago_ms


def test_iso_times_with_offset_zulu_and_local() -> None:
    assert parse_time("2023-11-14T22:13:20Z", now_ms=0) == 1_700_000_000_000
    assert parse_time("2023-11-14T23:13:20+01:00", now_ms=0) == 1_700_000_000_000
    naive = datetime(2023, 11, 14, 22, 13, 20)
    assert parse_time("2023-11-14T22:13:20", now_ms=0) == int(naive.astimezone().timestamp() * 1000)


@pytest.mark.parametrize("text", ["yesterday", "10 minutes", "-5m", ""])
def test_a_bad_time_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="not a time"):
        parse_time(text, now_ms=NOW)


def test_an_empty_time_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="after --until"):
        ReplayFilter.build(since="1h", until="2h", now_ms=NOW)


# ------------------------------------------------------------------ filters


def test_every_filter_selects_and_rejects() -> None:
    letter = _letter(_dead())
    assert ReplayFilter().matches(letter)
    assert ReplayFilter(error_classes=frozenset({"unknown-model", "shape-mismatch"})).matches(letter)
    assert not ReplayFilter(error_classes=frozenset({"shape-mismatch"})).matches(letter)
    assert ReplayFilter(stage="classify").matches(letter) and not ReplayFilter(stage="score").matches(letter)
    assert ReplayFilter(key="c-1").matches(letter) and not ReplayFilter(key="c-2").matches(letter)
    assert not ReplayFilter(key="c-1").matches(_letter(_dead(), key=None))
    since = ReplayFilter.build(since="2m", now_ms=NOW)
    assert since.matches(letter) and not ReplayFilter.build(since="30s", now_ms=NOW).matches(letter)
    assert ReplayFilter.build(until="30s", now_ms=NOW).matches(letter)
    assert not ReplayFilter.build(until="2m", now_ms=NOW).matches(letter)


def test_time_filters_use_the_record_timestamp_when_error_time_is_missing() -> None:
    headers = [(k, v) for k, v in _dead() if k != "error-time"]
    letter = _letter(headers)
    assert letter.failed_at_ms == NOW - 3_600_000
    assert not ReplayFilter.build(since="10m", now_ms=NOW).matches(letter)


# ------------------------------------------------------------------ verdicts


def test_a_selected_letter_goes_back_to_its_source_topic_or_to_the_override() -> None:
    letter = _letter(_dead())
    assert ReplayRules().plan(letter).verdict is Verdict.SEND
    assert ReplayRules().plan(letter).target == "t.requests"
    assert ReplayRules(to_topic="other").plan(letter).target == "other"
    assert ReplayRules(filter=ReplayFilter(stage="x")).plan(letter).verdict is Verdict.NOT_SELECTED


def test_without_a_source_topic_only_an_override_gives_a_target() -> None:
    letter = _letter(_dead(source=None))
    plan = ReplayRules().plan(letter)
    assert plan.verdict is Verdict.NO_TARGET and "--to" in plan.detail
    assert ReplayRules(to_topic="other").plan(letter).verdict is Verdict.SEND


def test_records_replayed_max_times_are_refused() -> None:
    twice = _dead([*ORIGINAL, ("replay-count", b"2")])
    assert _letter(twice).replay_count == 2
    assert ReplayRules(max_replays=3).plan(_letter(twice)).verdict is Verdict.SEND
    refused = ReplayRules(max_replays=2).plan(_letter(twice))
    assert refused.verdict is Verdict.REFUSED and refused.target == "t.requests"
    assert "replayed 2 time(s) already (--max-replays 2)" in refused.detail
    # A claim check's manifest may say more than the trimmed dead letter.
    assert ReplayRules(max_replays=2).plan(_letter(_dead()), replay_count=2).verdict is Verdict.REFUSED


def test_a_dead_letter_whose_request_already_has_a_result_is_refused() -> None:
    """Issue 26: a worker replaying after a crash dead-lettered requests (deadline passed)
    whose results were already out; replaying those would answer them a second time."""
    answered = ReplayRules(answered=frozenset({b"c-1"}))
    refused = answered.plan(_letter(_dead()))
    assert refused.verdict is Verdict.ANSWERED and "has a result" in refused.detail
    assert answered.plan(_letter(_dead(), key=b"c-2")).verdict is Verdict.SEND, "another request: sent"
    assert answered.plan(_letter(_dead(), key=None)).verdict is Verdict.SEND, "no key: nothing to match"


# ------------------------------------------------------------------ headers


def test_a_replay_sends_the_original_headers_plus_replay_count() -> None:
    dead = claim_check_headers(_dead(), ClaimCheck(size=3, sha256="ab", uri="s3://b/k/value"))
    assert replayed_headers(dead, 1) == [*ORIGINAL, ("replay-count", b"1")]


def test_replay_count_is_replaced_not_repeated_and_survives_a_second_dead_letter() -> None:
    first = replayed_headers(_dead(), 1)
    again = _dead(first)  # the stage dead-letters the replayed record: headers carried
    assert read_replay_count(again) == 1
    second = replayed_headers(again, read_replay_count(again) + 1)
    assert [v for k, v in second if k == "replay-count"] == [b"2"]
    assert second == [*ORIGINAL, ("replay-count", b"2")]


@pytest.mark.parametrize("value", [b"x", b"-1", b"", None])
def test_an_unreadable_replay_count_reads_as_zero(value: bytes | None) -> None:
    assert read_replay_count([("replay-count", value)]) == 0  # type: ignore[list-item]


def test_every_consumed_dead_letter_says_where_it_was_read() -> None:
    record = FakeRecord(headers=list(ORIGINAL), topic="t.requests", partition=3, offset=9)
    out = dead_letter_of(record, stage="s", topic="t.dead-letters", error_class="unknown-model", reason="r")
    assert out.headers[: len(ORIGINAL)] == ORIGINAL, "the original headers first, byte for byte"
    source = read_source(out.headers)
    assert source is not None and (source.topic, source.partition, source.offset) == ("t.requests", 3, 9)
    # A record salvaged by position already carries it: not repeated.
    salvaged = FakeRecord(headers=source_position_headers("t.requests", 3, 9), topic="t.requests", partition=3, offset=9)
    out = dead_letter_of(salvaged, stage="s", topic="t.dead-letters", error_class="unreadable-record", reason="r")
    assert [k for k, _ in out.headers].count("source-topic") == 1


# ------------------------------------------------------------------ claim-check manifests


def test_a_manifest_gives_back_the_key_and_headers_it_was_written_with() -> None:
    name = ClaimName("t.requests", 1, 5)
    data = manifest(name, b"k", b"value", ORIGINAL)
    assert parse_manifest(data) == (b"k", ORIGINAL)
    assert manifest_key("s3://dead-letters/t.requests/1/5/value") == "s3://dead-letters/t.requests/1/5/record.json"
    with pytest.raises(ClaimCheckMismatch, match="unreadable claim-check manifest"):
        parse_manifest(b"{not json")


def test_letter_reads_a_claim_check() -> None:
    check = ClaimCheck(size=10, sha256="ab" * 32, uri="s3://b/t/0/1/value")
    letter = _letter(claim_check_headers(_dead(), check))
    assert letter.claim_check == check
    assert datetime.fromtimestamp(letter.failed_at_ms / 1000, timezone.utc).year == 2023
