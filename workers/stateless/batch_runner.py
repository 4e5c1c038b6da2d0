"""One batch of a stateless stage through its backend: the failure policy, then each
request's outcome (its result, or its dead letter).

Failure policy (the backend classifies each error, the runner applies it):
- an *outage* (server down, starting, shutting down) is not the request's
  fault: the batch waits with backoff, holding its in-flight slot, so the
  consumer pauses (bounded memory) and nothing is dead-lettered for it;
- a *transient* error (UNAVAILABLE, timeout from a live server) is retried with
  backoff up to ``retry.max_attempts``; then the requests are dead-lettered;
- any other error for a batch of several requests is retried request by
  request, so only the request that causes it is dead-lettered;
- a request whose deadline passes while it waits is dead-lettered before the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.headers import Headers
from pipeline.contract.records import ResultHeaders
from pipeline.contract.request import InferenceRequest, forward_request
from pipeline.contract.response import encode_response
from pipeline.contract.response_batch import CONTENT_TYPE as RESPONSE_TYPE
from pipeline.contract.response_batch import encode_batched_responses, encode_responses
from pipeline.failure_policy import Failure, FailureKind, GaveUp, RetryPolicy, call_with_retry
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs, OutRecord
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.record_trace import record_trace
from pipeline.observability.tracing import call_span
from workers.runtime.stage_io import StageIO
from workers.stateless.backend import BatchBackend, BatchOutput
from workers.stateless.features import ResultStep
from workers.stateless.tensor_map import TensorMap


@dataclass(eq=False, slots=True)
class Pending:
    """A request in the batcher, waiting for its call."""

    record: ConsumedRecord
    slot: Slot[Outputs]
    request: InferenceRequest  # as the backend sees it (model tensor names)
    message: InferenceRequest  # as it arrived (topology tensor names)
    prepared: object
    rows: int
    enqueued: float
    length: int | None = None  # the true length of a padded request (its outputs are trimmed to it)
    tenant: str = ""  # tenant quotas: whose request (fair batches)


DeadLetter = Callable[[ConsumedRecord, Slot[Outputs], ErrorClass, str], None]


@dataclass
class BatchRunner:
    """Runs batches for one stage; completes each request's slot with its outcome."""

    io: StageIO
    backend: BatchBackend
    retry: RetryPolicy
    metrics: PipelineMetrics
    tensor_map: TensorMap
    results: tuple[ResultStep, ...]
    complete_all: Callable[[list[Slot[Outputs]], list[OutRecord]], None]  # one output per slot
    dead_letter: DeadLetter
    on_retry: Callable[[Failure], None]

    async def serve(self, items: list[Pending]) -> None:
        """Run the batch under the failure policy until every item has an output."""
        live = items

        async def attempt() -> BatchOutput | None:
            nonlocal live
            live = self._drop_expired(live)  # a request may expire between attempts
            return await self._call(live) if live else None

        try:
            output = await call_with_retry(
                attempt,
                self.backend.classify,
                self.retry,
                label=f"{self.io.stage}: {self.backend.name}",
                on_retry=self.on_retry,
            )
        except GaveUp as gave_up:
            if gave_up.failure.kind is FailureKind.PERMANENT and len(live) > 1:
                # Find the culprit: each request alone (the others may well succeed), one
                # after another inside this batch's in-flight slot, so a split never
                # exceeds max_inflight_batches calls.
                for item in live:
                    await self.serve([item])
            else:
                for item in live:
                    self.fail(item, gave_up.failure.error_class, gave_up.failure.reason)
            return
        if output is not None:
            self._succeed(live, output)

    async def _call(self, items: list[Pending]) -> BatchOutput:
        # One observation per call, not per request: the longest wait in the batch, which is
        # what a latency bound is about (issue 22: metrics by batch).
        self.metrics.queue_delay.labels(self.io.stage).observe(time.monotonic() - min(item.enqueued for item in items))
        rows = sum(item.rows for item in items)
        self.metrics.batch_size.labels(self.io.stage).observe(rows)
        # Tracing: each record's wait ends; the call is one span, child of the first record's
        # span (a batch of one is one tree) and linked to every record's.
        spans = []
        for item in items:
            if (trace := record_trace(item.slot)) is not None:
                trace.dequeued(len(items))
                spans.append(trace.span)
        batch = {"pipeline.batch.rows": rows, "pipeline.batch.requests": len(items)} if spans else None
        started = time.perf_counter()
        with call_span(self.backend.call_span, spans[0] if spans else None, spans, batch):
            output = await self.backend.run([item.request for item in items], [item.prepared for item in items])
        self.metrics.triton_latency.labels(self.io.stage, self.backend.name).observe(time.perf_counter() - started)
        return output

    def _succeed(self, items: list[Pending], output: BatchOutput) -> None:
        """Each request's result: the stage's result steps and tensor map per request, then
        the values and headers of the whole batch in one pass where they share a layout
        (:mod:`pipeline.contract.response_batch`), else request by request."""
        passes_through = self.tensor_map.passes_through  # datatypes only where a record is encoded alone
        if output.arrays is not None and passes_through and not self.results and not self.io.emit_requests:
            # The bare path: results straight from the batch's arrays, never split per request.
            values = encode_batched_responses(
                [item.message for item in items], output.arrays, output.rows,
                model_name=output.model_name, model_version=output.model_version,
            )  # fmt: skip
            if values is not None:
                self._complete_results(items, values, output)
                return
        ready: list[tuple[Pending, dict[str, np.ndarray], dict[str, str] | None]] = []
        for item, outputs in zip(items, output.outputs, strict=True):
            for step in self.results:
                outputs = step(outputs, item.length)
            if passes_through:
                ready.append((item, outputs, None))
                continue
            try:
                ready.append((item, *self.tensor_map.from_model(item.message, outputs)))
            except BadRequest as bad:
                self.fail(item, bad.error_class, bad.reason)
        model, version = output.model_name, output.model_version
        values = None
        if not self.io.emit_requests and ready:
            values = encode_responses(
                [item.message for item, _, _ in ready], [t for _, t, _ in ready], model_name=model, model_version=version
            )
        if values is None:
            for item, produced, known in ready:
                tensors, datatypes = (produced, known) if known is not None else self.tensor_map.from_model(item.message, produced)
                self._succeed_one(item, tensors, datatypes, model, version, output.route)
            return
        self._complete_results([item for item, _, _ in ready], values, output)

    def _complete_results(self, items: list[Pending], values: list[bytes], output: BatchOutput) -> None:
        """Results (not messages for a next stage, which keep their input's timestamp and
        partition) with the headers the batch shares: the whole batch's records in one pass,
        handed to the outbox at once."""
        headers = ResultHeaders(
            stage=self.io.stage, model_name=output.model_name, model_version=output.model_version,
            content_type=RESPONSE_TYPE, route=output.route,
        )  # fmt: skip
        topic, plain = self.io.output_topic, OutRecord.plain
        records = [
            plain(topic, item.record.key, value, headers.of(item.record.headers, item.request.correlation_id),
                  item.record.timestamp, None)
            for item, value in zip(items, values, strict=True)
        ]  # fmt: skip
        self.complete_all([item.slot for item in items], records)

    def _succeed_one(
        self,
        item: Pending,
        tensors: dict[str, np.ndarray],
        datatypes: dict[str, str],
        model: str,
        version: str,
        route: str | None,
    ) -> None:
        try:
            if self.io.emit_requests:
                value, content_type = forward_request(item.message, tensors, datatypes)
            else:
                value, content_type = encode_response(
                    item.message, tensors, model_name=model, model_version=version, parameters=item.message.parameters
                )
        except BadRequest as bad:
            self.fail(item, bad.error_class, bad.reason)
            return
        headers = ResultHeaders(
            stage=self.io.stage, model_name=model, model_version=version, content_type=content_type, route=route
        )
        self._complete(item, value, headers.of(item.record.headers, item.request.correlation_id))

    def _complete(self, item: Pending, value: bytes, headers: Headers) -> None:
        self.complete_all(
            [item.slot],
            [OutRecord.plain(
                self.io.output_topic,
                item.record.key,
                value,
                headers,
                request_timestamp_ms=item.record.timestamp,
                timestamp_ms=item.record.timestamp if self.io.emit_requests else None,
                # To a next stage: the input's partition number, so each of its partitions has one writer.
                partition=item.record.partition if self.io.emit_requests else None,
            )],
        )  # fmt: skip

    def fail(self, item: Pending, error_class: ErrorClass, reason: str) -> None:
        self.dead_letter(item.record, item.slot, error_class, reason)

    def _drop_expired(self, items: list[Pending]) -> list[Pending]:
        """Dead-letter requests whose deadline passed while they waited; keep the rest."""
        now_ms = int(time.time() * 1000)
        live = []
        for item in items:
            if item.request.expired(now_ms):
                self.fail(item, ErrorClass.DEADLINE_EXCEEDED, "deadline exceeded while queued")
            else:
                live.append(item)
        return live


def expired(request: InferenceRequest) -> bool:
    """Whether the request's deadline has passed (no clock read for the many without one)."""
    return request.deadline_ms is not None and request.expired(int(time.time() * 1000))
