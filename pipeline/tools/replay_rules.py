"""Which dead letters ``pipeline replay`` sends, where, and which it refuses: pure rules.

A dead letter is read once (:class:`Letter`), then judged by :class:`ReplayRules`:

* **not selected**: a filter (error class, stage, key, time range) leaves it out;
* **refused**: it has already been replayed ``max_replays`` times (its
  ``replay-count`` header), so a record that always fails stops going round; or its
  correlation id already has a result on the topology's result topic (``answered``):
  under at-least-once a worker that replays records after a crash can dead-letter one
  whose result was already out (its deadline passed meanwhile), and replaying that
  dead letter would answer the request twice;
* **no target**: neither ``--to`` nor its ``source-topic`` header says where to send it
  (join expiries and ``result-too-large`` claim checks have no source);
* **send**: to ``--to``, else back to the topic it was consumed from.

Time filters use the time it was dead-lettered (``error-time``), falling back to the
record's timestamp (which is the *request's*: stages keep it on dead letters).
Nothing here does I/O, so every rule is unit-tested without a broker.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pipeline.contract.errors import TextEnum
from pipeline.contract.records import (
    ClaimCheck,
    DeadLetter,
    SourcePosition,
    read_claim_check,
    read_dead_letter,
    read_replay_count,
    read_source,
)
from pipeline.errors import ConfigError
from pipeline.kafka.records import ConsumedRecord

#: Replays a record may have had before it is refused (``--max-replays``).
DEFAULT_MAX_REPLAYS = 3

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_time(text: str, *, now_ms: int) -> int:
    """``10m``, ``2h``, ``1d``, ``30s``, ``500ms`` (that long ago) or an ISO 8601 time
    (``2025-01-31T12:00:00Z``; without an offset, local time) -> ms since the epoch."""
    match = _RELATIVE.match(text)
    if match:
        return now_ms - int(float(match.group(1)) * _UNIT_MS[match.group(2)])
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"not a time: {text!r} (use ISO 8601 such as 2025-01-31T12:00:00Z, or a relative 10m, 2h, 1d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time, as a person typing it means
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class Letter:
    """One record read from a dead-letter topic, with what its headers say."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    failure: DeadLetter
    source: SourcePosition | None
    replay_count: int
    claim_check: ClaimCheck | None

    @classmethod
    def of(cls, record: ConsumedRecord) -> Letter:
        headers: list[tuple[str, bytes | None]] = list(record.headers or ())
        return cls(
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=record.timestamp,
            key=record.key,
            value=record.value,
            headers=headers,
            failure=read_dead_letter(headers),
            source=read_source(headers),
            replay_count=read_replay_count(headers),
            claim_check=read_claim_check(headers),
        )

    @property
    def failed_at_ms(self) -> int:
        """When it was dead-lettered (``error-time``), else the record's timestamp."""
        return self.failure.time_ms if self.failure.time_ms is not None else self.timestamp_ms

    @property
    def key_text(self) -> str:
        if self.key is None:
            return "-"
        return self.key.decode("utf-8", errors="backslashreplace")


@dataclass(frozen=True)
class ReplayFilter:
    """Which dead letters to select; an empty filter selects every one."""

    error_classes: frozenset[str] = frozenset()
    stage: str | None = None
    key: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    @classmethod
    def build(
        cls,
        *,
        error_classes: Sequence[str] = (),
        stage: str | None = None,
        key: str | None = None,
        since: str | None = None,
        until: str | None = None,
        now_ms: int,
    ) -> ReplayFilter:
        """From the CLI's flags; a bad time or an empty range is a :class:`ConfigError`."""
        since_ms = None if since is None else parse_time(since, now_ms=now_ms)
        until_ms = None if until is None else parse_time(until, now_ms=now_ms)
        if since_ms is not None and until_ms is not None and since_ms > until_ms:
            raise ConfigError(f"--since {since} is after --until {until}")
        return cls(frozenset(error_classes), stage, key, since_ms, until_ms)

    def matches(self, letter: Letter) -> bool:
        if self.error_classes and letter.failure.error_class not in self.error_classes:
            return False
        if self.stage is not None and letter.failure.stage != self.stage:
            return False
        if self.key is not None and (letter.key is None or letter.key != self.key.encode("utf-8")):
            return False
        moment = letter.failed_at_ms
        if self.since_ms is not None and moment < self.since_ms:
            return False
        return self.until_ms is None or moment <= self.until_ms


class Verdict(TextEnum):
    """What the rules make of one dead letter."""

    NOT_SELECTED = "not-selected"
    REFUSED = "refused"
    ANSWERED = "answered"
    NO_TARGET = "no-target"
    SEND = "send"


@dataclass(frozen=True)
class Plan:
    verdict: Verdict
    target: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class ReplayRules:
    """The filter, the replay bound and the ``--to`` override of one replay run."""

    filter: ReplayFilter = field(default_factory=ReplayFilter)
    max_replays: int = DEFAULT_MAX_REPLAYS
    to_topic: str | None = None
    answered: frozenset[bytes] = frozenset()
    """Correlation ids (record keys) that already have a result: their dead letters are
    refused, so a replay never gives a request a second, different outcome (a deadline
    judged on a worker's replay after its first result was out, issue 26)."""

    def plan(self, letter: Letter, *, replay_count: int | None = None, source: SourcePosition | None = None) -> Plan:
        """The verdict for ``letter``. ``replay_count`` and ``source`` override what its
        own headers say (a claim check's manifest holds headers the dead letter dropped)."""
        if not self.filter.matches(letter):
            return Plan(Verdict.NOT_SELECTED)
        count = letter.replay_count if replay_count is None else replay_count
        where = source or letter.source
        target = self.to_topic or (where.topic if where is not None else None)
        if count >= self.max_replays:
            return Plan(Verdict.REFUSED, target, f"replayed {count} time(s) already (--max-replays {self.max_replays})")
        if letter.key is not None and letter.key in self.answered:
            return Plan(Verdict.ANSWERED, target, "its correlation id has a result (--replay-answered sends it)")
        if target is None:
            return Plan(Verdict.NO_TARGET, None, "no source-topic header: say where with --to TOPIC")
        return Plan(Verdict.SEND, target)
