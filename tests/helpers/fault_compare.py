"""Compare a faulted run's outputs with a fault-free run's, output by output.

Why: a fault (a crash, a restart, an outage, a backlog) may add duplicates, and each
duplicate must be an exact copy of the first delivery; it must not lose an output,
change one, add one, or reorder a key's outputs. That holds for every topology, so the
comparison is written once here, keyed by what each output stands for (its identity):
:func:`by_key` where one request has one result (stateless, ensemble: the key is the
correlation ID), :func:`by_stream_result` for streams (key, result type, chunk or
segment index).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.contract.response import decode_response
from tests.helpers.figures import FaultFigures
from tests.helpers.kafka_io import header
from tests.helpers.topology_process import TopologyFiles

Rec = ConsumerRecord[bytes, bytes]
Identity = Callable[[Rec], Hashable]
"""What a result record stands for: two deliveries with one identity are one result twice."""


def by_key(record: Rec) -> Hashable:
    """One result per key (the key is the request's correlation ID)."""
    return record.key


def by_stream_result(record: Rec) -> Hashable:
    """A stream's result: its key, ``result-type`` and chunk (or segment) index."""
    params = decode_response(record.value, record.headers).parameters
    index = params.get("segment_index", params.get("chunk_index", -1))
    return (record.key, header(record, "result-type"), str(index))


@dataclass
class RunOutputs:
    """A run's outputs: every delivery of each result, by identity, in the order read
    (a key's records share a partition, so that is the order they were written)."""

    results: dict[Hashable, list[Rec]] = field(default_factory=dict)
    dead_letters: list[Rec] = field(default_factory=list)
    order: dict[bytes | None, list[Hashable]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def of(cls, records: list[Rec], topology: TopologyFiles, identity: Identity) -> RunOutputs:
        out = cls()
        for record in records:
            if record.topic == topology.dead_letter_topic:
                out.dead_letters.append(record)
            elif record.topic == topology.result_topic:
                ident = identity(record)
                if ident not in out.results:
                    out.results[ident] = []
                    out.order[record.key].append(ident)
                out.results[ident].append(record)
        return out

    @classmethod
    def read(cls, bootstrap: str, topology: TopologyFiles, identity: Identity) -> RunOutputs:
        """Everything the result and dead-letter topics hold now, read to their end."""
        topics = [topology.result_topic, topology.dead_letter_topic]
        return cls.of(asyncio.run(read_to_end(bootstrap, topics)), topology, identity)

    def duplicates(self) -> int:
        return sum(len(records) - 1 for records in self.results.values())

    def inexact(self) -> list[Hashable]:
        """Identities delivered more than once with different values (must be none)."""
        return [i for i, records in self.results.items() if any(r.value != records[0].value for r in records[1:])]


async def read_to_end(bootstrap: str, topics: list[str], timeout: float = 60.0) -> list[Rec]:
    """Every record of ``topics`` up to their end offsets as of now."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        partitions = [
            TopicPartition(topic, p) for topic in topics for p in sorted(await _partitions(consumer, topic))
        ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records: list[Rec] = []
        deadline = time.monotonic() + timeout
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            assert time.monotonic() < deadline, f"could not read {topics} to their end in {timeout:.0f}s"
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    """The topic's partitions (none when it does not exist: a dead-letter topic nobody wrote)."""
    known = consumer.partitions_for_topic(topic)
    if known is None:
        await consumer._client.force_metadata_update()  # no public refresh for an unsubscribed topic
        known = consumer.partitions_for_topic(topic)
    return set(known or ())


def same_output(a: Rec, b: Rec) -> bool:
    """Equal values; or equal parameters and outputs equal to float tolerance (a request
    batched with other neighbours may differ in the last bits of a float)."""
    if a.value == b.value:
        return True
    ra, rb = decode_response(a.value, a.headers), decode_response(b.value, b.headers)
    if ra.correlation_id != rb.correlation_id or ra.parameters != rb.parameters or set(ra.outputs) != set(rb.outputs):
        return False
    return all(np.allclose(ra.outputs[n], rb.outputs[n], rtol=1e-4, atol=1e-5) for n in ra.outputs)


@dataclass(frozen=True)
class Comparison:
    """A faulted run against the fault-free reference of the same records."""

    sent: int
    results: int
    duplicates: int
    inexact: list[Hashable]
    missing: list[Hashable]
    lost: list[Hashable]
    """Missing, and not a dead letter either (by key): no outcome at all."""
    extra: list[Hashable]
    changed: list[Hashable]
    reordered: list[bytes | None]
    dead_letters: int
    unexpected_dead: list[Rec]

    def problems(self) -> list[str]:
        """What differs from the reference, one line each (empty: only exact duplicates)."""
        found = [
            f"{len(items)} {what}, e.g. {list(items)[:3]}"
            for what, items in (
                ("lost: no result and no dead letter", self.lost),
                ("missing: in the reference, not in this run", self.missing),
                ("extra: not in the reference", self.extra),
                ("changed: different from the reference", self.changed),
                ("duplicates not equal to their first delivery", self.inexact),
                ("keys whose results came in another order", self.reordered),
            )
            if items
        ]
        if self.unexpected_dead:
            reasons = [header(r, "error-reason") for r in self.unexpected_dead[:3]]
            found.append(f"{len(self.unexpected_dead)} dead letters the reference does not have, e.g. {reasons}")
        return found

    def assert_only_exact_duplicates(self) -> None:
        problems = self.problems()
        assert not problems, "; ".join(problems)

    def figures(self, scenario: str, topology: str, *, recovery_s: float | None, note: str = "") -> FaultFigures:
        return FaultFigures(
            scenario=scenario,
            topology=topology,
            sent=self.sent,
            results=self.results,
            duplicates=self.duplicates,
            exact_duplicates=not self.inexact,
            dead_letters=self.dead_letters,
            lost=len(self.lost),
            recovery_s=recovery_s,
            note=note,
        )


def compare(
    reference: RunOutputs,
    faulted: RunOutputs,
    *,
    sent: int,
    expected_dead: Callable[[Rec], bool] = lambda _record: False,
) -> Comparison:
    """``faulted`` against ``reference``: the same results (first deliveries), in the same
    order per key, duplicates exact, and no dead letter the reference lacks unless
    ``expected_dead`` accepts it (a scenario's deliberate one)."""
    want, got = reference.results, faulted.results
    missing = [i for i in want if i not in got]
    reference_dead = {(r.key, r.value) for r in reference.dead_letters}
    return Comparison(
        sent=sent,
        results=len(got),
        duplicates=faulted.duplicates(),
        inexact=faulted.inexact(),
        missing=missing,
        lost=[i for i in missing if not {r.key for r in want[i]} & {r.key for r in faulted.dead_letters}],
        extra=[i for i in got if i not in want],
        changed=[i for i in want if i in got and not same_output(want[i][0], got[i][0])],
        reordered=[
            key
            for key, order in faulted.order.items()
            if [i for i in order if i in want] != [i for i in reference.order.get(key, []) if i in got]
        ],
        dead_letters=len(faulted.dead_letters),
        unexpected_dead=[
            r for r in faulted.dead_letters if (r.key, r.value) not in reference_dead and not expected_dead(r)
        ],
    )


def recovery_s(out: RunOutputs, fault_end_ms: int) -> float | None:
    """Seconds from the fault's end to the first result written after it (the result
    record's timestamp, set when the worker produced it); None when there is none."""
    after = [r.timestamp for records in out.results.values() for r in records if r.timestamp >= fault_end_ms]
    return (min(after) - fault_end_ms) / 1000 if after else None
