"""What a consume run saw, in the numbers an operator checks first.

* counts by kind, and dead letters by ``error-class``;
* correlation ids: distinct, and duplicates (a result delivered twice after a
  worker crash is legal, at-least-once, but worth seeing);
* end-to-end latency: record timestamp minus the producer's ``sent-at-ms``,
  as nearest-rank percentiles (exact values that did occur, not interpolations);
* ordering: records whose ``sent-at-ms`` went backwards within one key of one
  partition. The pipeline promises per-key order, so any count above zero is
  a finding (or, across producers, clock skew); it is reported, not judged.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from pipeline.tools.decoding import Consumed, Kind

N = TypeVar("N", int, float)


@dataclass(frozen=True)
class Latency:
    """Percentiles of end-to-end latency in milliseconds, over ``count`` records."""

    count: int
    p50: int
    p90: int
    p99: int
    max: int

    @classmethod
    def of(cls, values: list[int]) -> Latency | None:
        if not values:
            return None
        ordered = sorted(values)
        return cls(
            count=len(ordered),
            p50=nearest_rank(ordered, 50),
            p90=nearest_rank(ordered, 90),
            p99=nearest_rank(ordered, 99),
            max=ordered[-1],
        )


@dataclass
class ConsumeSummary:
    """Running totals; feed every record to :meth:`add`."""

    records: int = 0
    kinds: Counter[Kind] = field(default_factory=Counter)
    dead_letter_classes: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    out_of_order: int = 0
    latencies_ms: list[int] = field(default_factory=list)
    _ids: set[str] = field(default_factory=set)
    _identities: set[tuple[str | None, str | None, str]] = field(default_factory=set)
    _last_sent: dict[tuple[str, int, bytes | None], int] = field(default_factory=dict)

    def add(self, record: Consumed) -> None:
        self.records += 1
        self.kinds[record.kind] += 1
        if record.dead_letter is not None:
            self.dead_letter_classes[record.dead_letter.error_class] += 1
        if record.correlation_id is not None:
            self._ids.add(record.correlation_id)
            if record.identity in self._identities:
                self.duplicates += 1
            else:
                self._identities.add(record.identity)
        if record.latency_ms is not None:
            self.latencies_ms.append(record.latency_ms)
        if record.sent_at_ms is not None:
            where = (record.topic, record.partition, record.key)
            last = self._last_sent.get(where)
            if last is not None and record.sent_at_ms < last:
                self.out_of_order += 1
            self._last_sent[where] = max(record.sent_at_ms, last or 0)

    @property
    def distinct_ids(self) -> int:
        return len(self._ids)

    @property
    def latency(self) -> Latency | None:
        return Latency.of(self.latencies_ms)

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (the last line of ``consume --json``)."""
        latency = self.latency
        return {
            "records": self.records,
            "results": self.kinds[Kind.RESULT],
            "requests": self.kinds[Kind.REQUEST],
            "dead_letters": self.kinds[Kind.DEAD_LETTER],
            "dead_letters_by_class": dict(sorted(self.dead_letter_classes.items())),
            "undecodable": self.kinds[Kind.UNDECODABLE],
            "distinct_correlation_ids": self.distinct_ids,
            "duplicates": self.duplicates,
            "latency_ms": None if latency is None else asdict(latency),
            "out_of_order": self.out_of_order,
        }


def nearest_rank(ordered: Sequence[N], percent: float) -> N:
    """The nearest-rank percentile of sorted, non-empty ``ordered``: a value that occurred
    (``pipeline consume``'s summary and ``pipeline bench`` both report these)."""
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]
