"""Real OTLP trace endpoints for tests and benchmarks: they store what they receive.

No collector binary installs here, so :func:`otlp_receiver` is a ``grpc.server``
implementing the OTLP ``TraceService`` from ``opentelemetry-proto`` (what our
exporter speaks), and :func:`otlp_http_receiver` takes OTLP/HTTP ``POST /v1/traces``
in protobuf or JSON (what Triton's C++ exporter sends: JSON, ids in hex). The test
reads the spans back.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from pipeline.embedded.process import free_port

_KINDS = {
    trace_pb2.Span.SPAN_KIND_INTERNAL: "internal",
    trace_pb2.Span.SPAN_KIND_SERVER: "server",
    trace_pb2.Span.SPAN_KIND_CLIENT: "client",
    trace_pb2.Span.SPAN_KIND_PRODUCER: "producer",
    trace_pb2.Span.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, ids as lowercase hex (as in ``traceparent``)."""

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    attributes: dict[str, object]
    service: str
    events: tuple[str, ...] = ()

    @classmethod
    def of(cls, span: trace_pb2.Span, service: str) -> ReceivedSpan:
        attributes = {a.key: getattr(a.value, a.value.WhichOneof("value") or "string_value") for a in span.attributes}
        return cls(
            name=span.name,
            kind=_KINDS.get(span.kind, "unspecified"),
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_id=span.parent_span_id.hex(),
            links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
            attributes=attributes,
            service=service,
            events=tuple(event.name for event in span.events),
        )


def _received(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    received = []
    for resource_spans in request.resource_spans:
        service = next((a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), "")
        for scope_spans in resource_spans.scope_spans:
            received += [ReceivedSpan.of(span, service) for span in scope_spans.spans]
    return received


def _received_json(body: dict[str, Any]) -> list[ReceivedSpan]:
    """OTLP/JSON: the protobuf's JSON form, except that ids are hex, not base64."""
    received = []
    for resource_spans in body.get("resourceSpans", []):
        attributes = resource_spans.get("resource", {}).get("attributes", [])
        service = next((a["value"].get("stringValue", "") for a in attributes if a["key"] == "service.name"), "")
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                received.append(
                    ReceivedSpan(
                        name=span["name"],
                        kind=_KINDS.get(int(span.get("kind", 0)), "unspecified"),
                        trace_id=span["traceId"].lower(),
                        span_id=span["spanId"].lower(),
                        parent_id=span.get("parentSpanId", "").lower(),
                        links=tuple((link["traceId"].lower(), link["spanId"].lower()) for link in span.get("links", [])),
                        attributes={a["key"]: next(iter(a["value"].values()), None) for a in span.get("attributes", [])},
                        service=service,
                        events=tuple(event["name"] for event in span.get("events", [])),
                    )
                )
    return received


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: OtlpReceiver) -> None:
        self.sink = sink

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.sink.add(_received(request))
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """Spans received so far (thread-safe); ``endpoint`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes."""

    def __init__(self, port: int) -> None:
        self.endpoint = f"http://127.0.0.1:{port}"
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.exports = 0

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self._spans += spans
            self.exports += 1

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def count(self) -> int:
        with self._lock:
            return len(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout: float) -> list[ReceivedSpan]:
        """Spans once ``done(spans)`` holds; raises after ``timeout`` seconds with what arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.spans
            if done(spans):
                return spans
            time.sleep(0.1)
        spans = self.spans
        names = sorted({s.name for s in spans})
        raise AssertionError(f"after {timeout}s: {len(spans)} spans received ({names})")

    def environment(self, *, schedule_delay_ms: int | None = 200) -> dict[str, str]:
        """``OTEL_*`` variables that make a process export every span here over gRPC
        (``schedule_delay_ms`` None: the SDK's default batch delay, 5 s)."""
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_TRACES_SAMPLER": "always_on",
        }
        if schedule_delay_ms is not None:
            env["OTEL_BSP_SCHEDULE_DELAY"] = str(schedule_delay_ms)
        return env


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/gRPC trace endpoint on a free loopback port, for the duration of the block."""
    port = free_port()
    receiver = OtlpReceiver(port)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(receiver), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield receiver
    finally:
        server.stop(grace=1).wait()


@contextmanager
def otlp_http_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP trace endpoint (``{endpoint}/v1/traces``) on a free loopback port."""
    receiver = OtlpReceiver(free_port())

    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.1: the exporter's connection stays open between exports. Under HTTP/1.0 the
        # server closed it after each answer, and an exporter that reused it lost that export
        # (Triton's spans of one call of two never came, CI 2026-11-28, twice).
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if "json" in self.headers.get("Content-Type", ""):
                receiver.add(_received_json(json.loads(body)))
            else:
                receiver.add(_received(trace_service_pb2.ExportTraceServiceRequest.FromString(body)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: a test's output is its assertions."""

    server = ThreadingHTTPServer(("127.0.0.1", int(receiver.endpoint.rsplit(":", 1)[1])), Handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp-http", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
