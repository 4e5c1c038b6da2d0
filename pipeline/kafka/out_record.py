"""What a consumed record turns into: :class:`OutRecord`, and who may rewrite one on its way out.

These are the outbox's vocabulary, shared by :class:`pipeline.kafka.outbox.Outbox` (which
re-exports them: the stages import them from there) and by the sending it delegates to
(:mod:`pipeline.kafka.output_sender`). They live apart so both build on them without an
import cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pipeline.contract.headers import Headers
from pipeline.kafka.ordering import Slot


@dataclass(frozen=True)
class OutRecord:
    """One record a consumed record turns into (a result, a dead letter, a checkpoint)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    dead_letter: bool = False
    error_class: str | None = None
    request_timestamp_ms: int | None = None
    partition: int | None = None  # None: the producer's partitioner picks by key
    after_acks: bool = False
    """Send only once every earlier output of the same partition line is acknowledged
    (a state checkpoint must never be visible before the results it accounts for)."""
    counts_as_result: bool = True  # metrics: checkpoints are not results
    timestamp_ms: int | None = None
    """The record's timestamp; None: the producer's clock. A message for a next stage keeps
    its input's, so every stage of a topology sees the request's event time."""
    redirected_from: tuple[str, int | None] | None = None
    """Set on a result sent to its reply topic: the topic and partition it was bound for."""
    version: int | None = None
    """A state record's place in the order its store decided (:mod:`pipeline.kafka.state_writes`:
    an older write of the same key is never written after a newer one)."""

    @classmethod
    def plain(
        cls,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        request_timestamp_ms: int | None,
        timestamp_ms: int | None,
        partition: int | None = None,
    ) -> OutRecord:
        """A result with every other field at its default, built for a tenth of what the frozen
        dataclass's ``__init__`` costs (it sets its 14 fields one ``object.__setattr__`` at a
        time: 3.1 µs, once per result of a stateless stage); equal to ``OutRecord(...)`` with
        the same arguments (``tests/unit/test_out_record.py``), and as frozen."""
        record = object.__new__(cls)
        record.__dict__.update(
            _PLAIN_DEFAULTS, topic=topic, key=key, value=value, headers=headers,
            request_timestamp_ms=request_timestamp_ms, timestamp_ms=timestamp_ms, partition=partition,
        )  # fmt: skip
        return record


Outputs = tuple[OutRecord, ...]

_PLAIN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(OutRecord) if f.default is not dataclasses.MISSING}
"""Every field's default: what :meth:`OutRecord.plain` does not set."""


class OversizeHandler(Protocol):
    """What the outbox does with outputs too large for their topic (a claim check:
    :class:`pipeline.deadletter.oversize.OversizeOutputs`)."""

    def too_large(self, out: OutRecord) -> bool: ...

    async def replace(self, out: OutRecord, slot: Slot[Outputs], index: int) -> OutRecord: ...

    async def replace_all(self, slot: Slot[Outputs], outputs: Outputs, which: Callable[[OutRecord], bool]) -> Outputs:
        """``outputs`` with those ``which`` selects replaced by claim-check dead letters."""
        ...


class ReplyRedirect(Protocol):
    """Where a result asking for a reply topic goes (:class:`pipeline.kafka.replies.ReplyRedirector`)."""

    def asks(self, out: OutRecord) -> bool: ...

    async def redirect(self, out: OutRecord) -> OutRecord: ...

    async def redirect_back(self, outputs: Outputs) -> Outputs: ...
