"""Outputs too large for their topic become claim-check dead letters, never a crash.

The outbox asks :meth:`OversizeOutputs.too_large` of every output when a slot
is completed (the record's exact size is known there, after headers are
final) and, for those that are, awaits :meth:`OversizeOutputs.replace` before
the slot counts as ready, so its partition's outputs keep their order while
other partitions go on. Two cases:

- a dead letter over ``dead_letter_max_bytes``: same record, value moved to
  the S3 store, claim-check headers appended;
- a result over ``max_record_bytes`` (no topic would take it): a
  ``result-too-large`` dead letter whose claim check holds the *result*
  (key, value and headers), named after the request's position.

Without an S3 store, or when the store fails, the dead letter still leaves,
with an empty value and ``claim-check-status: not-kept`` (and a counter): the
record has its outcome; only the payload is lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import cast

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.contract import headers as h
from pipeline.contract.errors import ErrorClass
from pipeline.contract.records import NOT_KEPT, STORED, ClaimCheck, claim_check_headers, dead_letter_headers
from pipeline.deadletter.claim_check import ClaimCheckStore, ClaimName, digest
from pipeline.kafka.clients import RecordLimits
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs, OutRecord

log = logging.getLogger(__name__)

_ERROR_HEADERS = (h.ERROR_STAGE, h.ERROR_CLASS, h.ERROR_REASON, h.ERROR_TIME)


def record_size(key: bytes | None, value: bytes | None, headers: h.HeaderPairs) -> int:
    """Upper bound of a record's size as the producer checks it against ``max_request_size``."""
    # No copy of a list (a result's headers are one): the copy was 60 % of this call's 0.9 µs.
    pairs = cast(list[tuple[str, bytes | None]], headers if isinstance(headers, list) else list(headers))
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, pairs))


@dataclasses.dataclass(kw_only=True)
class OversizeOutputs:
    """One stage's rule for outputs over the limits, with its claim-check store (or none)."""

    stage: str
    dead_letter_topic: str
    limits: RecordLimits
    store: ClaimCheckStore | None
    on_claim_check: Callable[[str], None] | None = None
    """Told ``stored`` or ``not-kept`` for each claim check (the stage's counter)."""

    def too_large(self, out: OutRecord) -> bool:
        """A dead letter over the dead-letter limit, or a result over the record limit.
        Other outputs (state checkpoints) are never rewritten."""
        if out.dead_letter:
            return record_size(out.key, out.value, out.headers) > self.limits.dead_letter_max_bytes
        if out.counts_as_result:
            return record_size(out.key, out.value, out.headers) > self.limits.max_record_bytes
        return False

    async def replace(self, out: OutRecord, slot: Slot[Outputs], index: int) -> OutRecord:
        """The claim-check dead letter standing for ``out`` (the ``index``-th output of
        ``slot``); never raises for an S3 failure."""
        dead = out if out.dead_letter else self._result_dead_letter(out)
        name = ClaimName(slot.tp.topic, slot.tp.partition, slot.offset, index)
        check = await self._store(name, dead)
        if self.on_claim_check is not None:
            self.on_claim_check(STORED if check.stored else NOT_KEPT)
        return self._fit(dead, check)

    async def replace_all(self, slot: Slot[Outputs], outputs: Outputs, which: Callable[[OutRecord], bool]) -> Outputs:
        """``outputs`` with those ``which`` selects replaced by claim-check dead letters."""
        return tuple([await self.replace(o, slot, i) if which(o) else o for i, o in enumerate(outputs)])

    def _result_dead_letter(self, out: OutRecord) -> OutRecord:
        size = record_size(out.key, out.value, out.headers)
        reason = f"result of {size} bytes is over the record limit of {self.limits.max_record_bytes} bytes"
        headers = dead_letter_headers(
            out.headers,
            stage=self.stage,
            error_class=ErrorClass.RESULT_TOO_LARGE,
            reason=reason,
            now_ms=int(time.time() * 1000),
        )
        return dataclasses.replace(
            out,
            topic=self.dead_letter_topic,
            headers=headers,
            dead_letter=True,
            error_class=ErrorClass.RESULT_TOO_LARGE.value,
            partition=None,
            after_acks=False,
        )

    async def _store(self, name: ClaimName, dead: OutRecord) -> ClaimCheck:
        size, sha = len(dead.value or b""), digest(dead.value)
        if self.store is None:
            log.warning("%s: payload of %s not kept: no S3 store configured", self.stage, name.base)
            return ClaimCheck(size=size, sha256=sha, error="no S3 store configured (PIPELINE_S3_ENDPOINT)")
        try:
            return await asyncio.to_thread(self.store.put, name, dead.key, dead.value, dead.headers)
        except Exception as exc:  # noqa: BLE001 - any S3 or transport failure: dead letter without payload
            log.warning("%s: payload of %s not kept: S3 put failed: %r", self.stage, name.base, exc)
            return ClaimCheck(size=size, sha256=sha, error=f"S3 put failed: {exc!r}")

    def _fit(self, dead: OutRecord, check: ClaimCheck) -> OutRecord:
        """Empty value plus claim-check headers; when the original headers (or key) alone
        are over the limit, only the error headers stay (the manifest keeps the rest)."""
        error_only = [(k, v) for k, v in dead.headers if k in _ERROR_HEADERS]
        candidates = [(dead.key, dead.headers), (dead.key, error_only), (None, error_only)]
        for key, headers in candidates:
            record = dataclasses.replace(dead, key=key, value=b"", headers=claim_check_headers(headers, check))
            if record_size(record.key, record.value, record.headers) <= self.limits.dead_letter_max_bytes:
                return record
        return record
