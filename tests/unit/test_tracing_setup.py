"""Tracing without servers: W3C context over Kafka headers, the record spans, and "off" doing nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from pipeline.errors import ConfigError
from pipeline.kafka.outbox import OutRecord
from pipeline.observability import tracing
from pipeline.observability.record_trace import RecordTracer, extract, inject
from pipeline.observability.tracing import CallSpan, call_span, exporter_names, grpc_metadata, start_tracing
from tests.helpers.otlp_receiver import otlp_receiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT}-01"


@dataclass
class _Record:
    topic: str = "requests"
    partition: int = 2
    offset: int = 41
    timestamp: int = 0
    key: bytes | None = b"cid-1"
    value: bytes | None = b"{}"
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on, spans kept in memory (the process-wide tracer replaced for the test)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_active", provider.get_tracer("test"))
    yield exporter
    provider.shutdown()


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _ids(context: trace.SpanContext | None) -> tuple[str, str] | None:
    return None if context is None else (_hex(context.trace_id, 32), _hex(context.span_id, 16))


# ---------------------------------------------------------------------- header propagation
def test_inject_then_extract_over_kafka_headers_round_trips_and_keeps_the_other_headers(
    exported: InMemorySpanExporter,
) -> None:
    span = tracing._active.start_span("s")  # type: ignore[union-attr]
    headers = [("content-type", b"application/json"), ("TraceParent", TRACEPARENT.encode()), ("x-app", b"\x00\xff")]
    stamped = inject(headers, span)
    assert stamped[:2] == [("content-type", b"application/json"), ("x-app", b"\x00\xff")]  # order and bytes kept
    assert [k for k, _ in stamped].count("traceparent") == 1 and all(k != "TraceParent" for k, _ in stamped)
    assert _ids(extract(stamped)) == _ids(span.get_span_context())


def test_extract_reads_names_case_insensitively_and_ignores_null_or_malformed_values() -> None:
    context = extract([("TRACEPARENT", TRACEPARENT.encode())])
    assert context is not None and _hex(context.trace_id, 32) == TRACE_ID and _hex(context.span_id, 16) == PARENT
    assert extract([("traceparent", None)]) is None  # type: ignore[list-item]
    assert extract([("traceparent", b"00-zz-not-a-trace")]) is None
    assert extract([("traceparent", b"\xff\xfe")]) is None
    assert extract(None) is None


# ---------------------------------------------------------------------- record spans
def test_a_record_span_continues_the_request_and_stamps_its_results(exported: InMemorySpanExporter) -> None:
    tracer = RecordTracer(tracing._active, "classify", "t.classify")  # type: ignore[arg-type]
    record = _Record(headers=[("traceparent", TRACEPARENT.encode()), ("correlation-id", b"cid-1")])
    traced = tracer.consumed(record)
    traced.queued()
    traced.dequeued(batch_requests=3)
    result = OutRecord("out", b"k", b"v", [("traceparent", TRACEPARENT.encode()), ("a", b"1")])
    dead = OutRecord("dl", b"k", b"v", list(record.headers), dead_letter=True, error_class="bad-header")
    checkpoint = OutRecord("state", b"k", b"s", [("traceparent", TRACEPARENT.encode())], counts_as_result=False)
    stamped = traced.completed((result, dead, checkpoint))
    # The result now names this stage's span; dead letters and checkpoints keep their bytes.
    assert _ids(extract(stamped[0].headers)) == _ids(traced.span.get_span_context())
    assert stamped[0].headers[0] == ("a", b"1")
    assert stamped[1] is dead and stamped[2] is checkpoint
    assert [s.name for s in exported.get_finished_spans()] == ["process requests"]
    traced.acknowledged()
    spans = {s.name: s for s in exported.get_finished_spans()}
    process, send = spans["process requests"], spans["send out"]
    assert process.kind is SpanKind.CONSUMER and send.kind is SpanKind.PRODUCER
    assert process.parent is not None and _hex(process.parent.span_id, 16) == PARENT
    assert _hex(process.context.trace_id, 32) == TRACE_ID
    assert send.parent == process.context
    (event,) = process.events
    assert event.name == "batch sent" and event.attributes is not None
    assert event.attributes["pipeline.batch.requests"] == 3 and event.attributes["pipeline.batch.wait_ms"] >= 0  # type: ignore[operator]
    assert process.attributes is not None
    assert process.attributes["messaging.destination.name"] == "requests"
    assert process.attributes["messaging.destination.partition.id"] == "2"
    assert process.attributes["messaging.kafka.offset"] == 41
    assert process.attributes["messaging.consumer.group.name"] == "t.classify"
    assert process.attributes["messaging.message.conversation_id"] == "cid-1"
    assert process.attributes["error.type"] == "bad-header"  # one of its outputs is a dead letter


def test_a_record_without_traceparent_starts_a_trace(exported: InMemorySpanExporter) -> None:
    traced = RecordTracer(tracing._active, "s", "g").consumed(_Record())  # type: ignore[arg-type]
    traced.completed(())
    (span,) = exported.get_finished_spans()
    assert span.parent is None and span.attributes is not None
    assert span.attributes["messaging.message.conversation_id"] == "cid-1"  # the key when no header


def test_a_batch_call_span_is_current_links_every_record_and_goes_to_triton_in_metadata(
    exported: InMemorySpanExporter,
) -> None:
    tracer = RecordTracer(tracing._active, "s", "g")  # type: ignore[arg-type]
    records = [tracer.consumed(_Record(offset=i)) for i in range(3)]
    spans = [r.span for r in records]
    with call_span(CallSpan("infer", remote=True, attributes={"rpc.system": "grpc"}), spans[0], spans):
        metadata = grpc_metadata()
        current = trace.get_current_span().get_span_context()
    assert metadata is not None and _ids(extract([("traceparent", metadata["traceparent"].encode())])) == _ids(current)
    (call,) = exported.get_finished_spans()
    assert call.kind is SpanKind.CLIENT and call.parent == spans[0].get_span_context()
    assert [link.context for link in call.links] == [s.get_span_context() for s in spans]


def test_join_links_the_other_branches(exported: InMemorySpanExporter) -> None:
    traced = RecordTracer(tracing._active, "join", "g").consumed(_Record())  # type: ignore[arg-type]
    traced.link([[("traceparent", TRACEPARENT.encode())], [("traceparent", b"junk")]])
    traced.completed(())
    (span,) = exported.get_finished_spans()
    assert [(_hex(link.context.trace_id, 32), _hex(link.context.span_id, 16)) for link in span.links] == [(TRACE_ID, PARENT)]


# ---------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp_proto_grpc"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, ["otlp_proto_http"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
          "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, ["otlp_proto_grpc"]),
        ({"OTEL_TRACES_EXPORTER": "otlp, Console"}, ["otlp_proto_grpc", "console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_exporters_follow_the_otel_variables(environ: dict[str, str], names: list[str]) -> None:
    assert exporter_names(environ) == names


def test_an_unknown_protocol_or_exporter_is_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match="grpc or http/protobuf"):
        exporter_names({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"})
    with pytest.raises(ConfigError, match="no installed package provides"):
        start_tracing("svc", {"OTEL_TRACES_EXPORTER": "zipkin_nowhere"})


def test_off_by_default_builds_no_provider_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_provider(*args: object, **kwargs: object) -> None:
        raise AssertionError("a tracer provider was built with tracing off")

    monkeypatch.setattr(tracing, "TracerProvider", no_provider)
    off = start_tracing("svc", {"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"})
    assert not off.enabled and tracing.active_tracer() is None
    assert grpc_metadata() is None
    with call_span(CallSpan("infer", remote=True), None):
        assert not trace.get_current_span().get_span_context().is_valid
    assert off.shutdown() is True


def test_otlp_tracing_exports_what_is_left_at_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real OTLP/gRPC endpoint; the batch delay is an hour, so only the shutdown flush sends."""
    with otlp_receiver() as receiver:
        for name, value in receiver.environment(schedule_delay_ms=3_600_000).items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        on = start_tracing("svc-default")
        try:
            assert on.enabled and on.exporters == ["otlp_proto_grpc"]
            tracer = tracing.active_tracer()
            assert tracer is not None
            RecordTracer(tracer, "s", "g").consumed(_Record()).completed(())
            assert receiver.count() == 0
        finally:
            assert on.shutdown(timeout_s=10) is True
        assert tracing.active_tracer() is None
        (span,) = receiver.spans
    assert span.name == "process requests" and span.kind == "consumer" and span.service == "svc-default"


def test_an_unsampled_record_passes_its_context_on_without_recording_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_active", provider.get_tracer("test"))
    traced = RecordTracer(tracing._active, "s", "g").consumed(_Record())  # type: ignore[arg-type]
    traced.queued()
    traced.dequeued(1)
    with call_span(CallSpan("infer", remote=True), traced.span, [traced.span]):
        metadata = grpc_metadata()
    (out,) = traced.completed((OutRecord("out", b"k", b"v", []),))
    traced.acknowledged()
    assert exporter.get_finished_spans() == ()
    # Triton and the next stage still get the (unsampled) context, so they decide the same way.
    assert metadata is not None and int(metadata["traceparent"][-2:], 16) & 1 == 0  # sampled flag off
    assert _ids(extract(out.headers)) == _ids(traced.span.get_span_context())
