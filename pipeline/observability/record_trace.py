"""One consumed record's spans: process (CONSUMER, with its wait in a batch as an event), its produce.

A :class:`RecordTrace` is made when a stage takes a record (its outbox slot
carries it) and continues the trace context of the record's headers (``traceparent``, or the
formats ``OTEL_PROPAGATORS`` names), read with OpenTelemetry's own propagators
over the Kafka header list. When the stage
completes the slot, every result (not dead letters, which keep the original
bytes, nor state checkpoints) gets this span's context as its ``traceparent``, so
the next stage's span is this one's child and one trace runs through every stage
and join; the process span ends and a PRODUCER span runs until the broker has
acknowledged the outputs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence

from opentelemetry import trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from pipeline.contract import headers as h
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability import messaging_names as msg
from pipeline.observability.tracing import PROPAGATOR, active_tracer

HeaderList = Sequence[tuple[str, bytes | None]]


class KafkaHeadersGetter(Getter[HeaderList]):
    """Reads a Kafka header list (names case-insensitive, null values skipped) for the propagator."""

    def get(self, carrier: HeaderList, key: str) -> list[str] | None:
        key = key.lower()
        values = [
            bytes(v).decode("utf-8", "replace")
            for k, v in carrier or ()
            if isinstance(k, str) and k.lower() == key and v is not None
        ]
        return values or None

    def keys(self, carrier: HeaderList) -> list[str]:
        return [k for k, _ in carrier or () if isinstance(k, str)]


GETTER = KafkaHeadersGetter()


def extract(headers: HeaderList | None) -> trace.SpanContext | None:
    """The valid span context a header list carries, else None."""
    context = trace.get_current_span(PROPAGATOR.extract(headers or (), getter=GETTER)).get_span_context()
    return context if context.is_valid else None


def inject(headers: h.HeaderPairs | None, span: trace.Span) -> h.Headers:
    """``headers`` with ``traceparent`` (and ``tracestate``) naming ``span``; the rest kept."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return h.replace_headers(headers, carrier.items())


def _messaging(operation: str, topic: str) -> dict[str, AttributeValue]:
    """The messaging attributes every Kafka span of ours has (OpenTelemetry's semantic conventions)."""
    return {
        msg.MESSAGING_SYSTEM: "kafka",
        msg.MESSAGING_OPERATION_NAME: operation,
        msg.MESSAGING_OPERATION_TYPE: operation,
        msg.MESSAGING_DESTINATION_NAME: topic,
    }


class RecordTracer:
    """Starts the record traces of one stage."""

    def __init__(self, tracer: Tracer, stage: str, group: str) -> None:
        self.tracer, self.stage, self.group = tracer, stage, group

    def consumed(self, record: ConsumedRecord) -> RecordTrace:
        headers = record.headers or ()
        parent = PROPAGATOR.extract(headers, getter=GETTER)
        correlation = GETTER.get(headers, h.CORRELATION_ID)
        key = correlation[0] if correlation else (record.key or b"").decode("utf-8", "replace")
        span = self.tracer.start_span(
            f"process {record.topic}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                **_messaging("process", record.topic),
                msg.MESSAGING_DESTINATION_PARTITION_ID: str(record.partition),
                msg.MESSAGING_KAFKA_OFFSET: record.offset,
                msg.MESSAGING_CONSUMER_GROUP_NAME: self.group,
                msg.MESSAGING_MESSAGE_CONVERSATION_ID: key,
                "pipeline.stage": self.stage,
            },
        )
        return RecordTrace(self.tracer, span)


class RecordTrace:
    """The spans of one record in one stage (the outbox's ``SlotTrace``)."""

    __slots__ = ("_produce", "_queued_ns", "span", "tracer")

    def __init__(self, tracer: Tracer, span: trace.Span) -> None:
        self.tracer = tracer
        self.span = span
        self._queued_ns = 0
        self._produce: trace.Span | None = None

    # ------------------------------------------------------------------ batching
    def queued(self) -> None:
        """The record joined a batch: its wait starts now (recorded only when sampled)."""
        if self.span.is_recording():
            self._queued_ns = time.time_ns()

    def dequeued(self, batch_requests: int) -> None:
        """Its batch is being sent: a ``batch sent`` event with the time it waited. An event,
        not a span: a third fewer spans per record, and the Python SDK's cost is per span."""
        if not self._queued_ns:
            return
        now = time.time_ns()
        waited_ms = (now - self._queued_ns) / 1e6
        attributes = {"pipeline.batch.wait_ms": waited_ms, "pipeline.batch.requests": batch_requests}
        self.span.add_event("batch sent", attributes, timestamp=now)
        self._queued_ns = 0

    def link(self, headers_of: Iterable[HeaderList]) -> None:
        """Link the spans other records' ``traceparent`` name (a join's other branches)."""
        for headers in headers_of:
            context = extract(headers)
            if context is not None and context.span_id != self.span.get_span_context().span_id:
                self.span.add_link(context, {"pipeline.link": "joined-branch"})

    # ------------------------------------------------------------------ outbox hooks
    def completed(self, outputs: Outputs) -> Outputs:
        """The stage is done with the record: stamp its results, end the span, start the produce."""
        stamped = tuple(
            dataclasses.replace(out, headers=inject(out.headers, self.span))
            if out.counts_as_result and not out.dead_letter
            else out
            for out in outputs
        )
        if self.span.is_recording():  # not sampled: only the context travels on
            self._produced(outputs)
        self.span.end()
        return stamped

    def _produced(self, outputs: Outputs) -> None:
        dead = next((out for out in outputs if out.dead_letter), None)
        if dead is not None:
            self.span.set_attribute(ERROR_TYPE, dead.error_class or "dead-letter")
            self.span.set_status(Status(StatusCode.ERROR, f"dead-lettered: {dead.error_class}"))
        if outputs:
            first = outputs[0]
            self._produce = self.tracer.start_span(
                f"send {first.topic}",
                context=trace.set_span_in_context(self.span),
                kind=SpanKind.PRODUCER,
                attributes={
                    **_messaging("send", first.topic),
                    msg.MESSAGING_BATCH_MESSAGE_COUNT: len(outputs),
                    "pipeline.dead_letter": dead is not None,
                },
            )
        else:
            self.span.set_attribute("pipeline.outputs", 0)

    def acknowledged(self) -> None:
        """The broker has every output: the produce span ends."""
        if self._produce is not None:
            self._produce.end()
            self._produce = None


def record_trace(slot: Slot[Outputs]) -> RecordTrace | None:
    """The slot's record trace (None when tracing is off)."""
    found = slot.trace
    return found if isinstance(found, RecordTrace) else None


def record_span(slot: Slot[Outputs]) -> trace.Span | None:
    """The slot's record span (None when tracing is off): the parent of calls made for it."""
    found = record_trace(slot)
    return found.span if found is not None else None


def stage_tracer(stage: str, group: str) -> RecordTracer | None:
    """The stage's record tracer when this process traces (:func:`start_tracing` ran), else None."""
    tracer = active_tracer()
    return RecordTracer(tracer, stage, group) if tracer is not None else None
