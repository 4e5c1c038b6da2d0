"""OpenTelemetry tracing for a process: built from the standard ``OTEL_*`` variables, off by default.

Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``,
``console``, or any ``opentelemetry_traces_exporter`` entry point; comma-separated
for several) and ``OTEL_SDK_DISABLED`` is not ``true``. Everything else is the
SDK's own environment configuration, read by the SDK, not here: the sampler
(``OTEL_TRACES_SAMPLER``/``_ARG``), the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``), the batch processor (``OTEL_BSP_*``) and the OTLP
exporter (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``_HEADERS``, ``_TIMEOUT``, ...).
``otlp`` picks its transport from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or
``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc``, the default; ``http/protobuf`` needs
the HTTP exporter package installed).

When off, no tracer provider exists at all: :func:`active_tracer` is ``None`` and
every caller skips its tracing work with one ``is None`` test, so records keep
their incoming ``traceparent`` untouched and nothing is allocated per record.
The provider is this process's own (not OpenTelemetry's global one, which can be
set only once per process), started by :func:`start_tracing` and flushed by
:meth:`Tracing.shutdown` on a graceful stop.

Context travels in the formats ``OTEL_PROPAGATORS`` names (default
``tracecontext,baggage``; ``b3``, ``jaeger``... when their packages are
installed), loaded by OpenTelemetry's own :mod:`opentelemetry.propagate`, so a
mesh that speaks B3 keeps one trace through the pipeline.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from importlib.metadata import entry_points

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Link, SpanKind, Tracer
from opentelemetry.util.types import AttributeValue

from pipeline.errors import ConfigError

log = logging.getLogger(__name__)

TRACER_NAME = "pipeline"


def configured_propagator() -> TextMapPropagator:
    """The propagators ``OTEL_PROPAGATORS`` names, as :mod:`opentelemetry.propagate` loaded them.

    Imported on first use: that module reads the variable when imported and raises on a
    name no installed package provides, which becomes a one-line error here."""
    try:
        from opentelemetry import propagate
    except ValueError as exc:
        raise ConfigError(f"OTEL_PROPAGATORS: {exc}") from None
    return propagate.get_global_textmap()


class _ConfiguredPropagator(TextMapPropagator):
    """:func:`configured_propagator`, looked up per call (it may be replaced with
    ``opentelemetry.propagate.set_global_textmap``, as OpenTelemetry allows)."""

    def extract(
        self, carrier: CarrierT, context: Context | None = None, getter: Getter[CarrierT] = default_getter
    ) -> Context:
        return configured_propagator().extract(carrier, context, getter=getter)

    def inject(
        self, carrier: CarrierT, context: Context | None = None, setter: Setter[CarrierT] = default_setter
    ) -> None:
        configured_propagator().inject(carrier, context, setter=setter)

    @property
    def fields(self) -> set[str]:
        return configured_propagator().fields


#: The propagator of every record header and gRPC call (Triton continues W3C trace context).
PROPAGATOR: TextMapPropagator = _ConfiguredPropagator()
_EXPORTER_GROUP = "opentelemetry_traces_exporter"
_OTLP_TRANSPORTS = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}

_active: Tracer | None = None


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporter entry points ``OTEL_TRACES_EXPORTER`` asks for (empty: tracing off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = []
    for name in environ.get("OTEL_TRACES_EXPORTER", "").split(","):
        name = name.strip().lower()
        if name in ("", "none"):
            continue
        if name == "otlp":
            protocol = (
                environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
            ).strip().lower()
            if protocol not in _OTLP_TRANSPORTS:
                raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: use grpc or http/protobuf")
            name = _OTLP_TRANSPORTS[protocol]
        names.append(name)
    return names


def _exporter(name: str) -> SpanExporter:
    """The exporter an entry point names (how the SDK's own auto-configuration finds them)."""
    found = entry_points(group=_EXPORTER_GROUP, name=name)
    if not found:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER asks for {name!r}, which no installed package provides "
            f"(installed: {', '.join(sorted(e.name for e in entry_points(group=_EXPORTER_GROUP))) or 'none'})"
        )
    exporter: SpanExporter = next(iter(found)).load()()
    return exporter


def _resource(default_service: str) -> Resource:
    """The SDK's resource from the environment; ``default_service`` when it names none."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service}))
    return resource


@dataclass
class Tracing:
    """This process's tracing: a provider when on, nothing when off."""

    provider: TracerProvider | None = None
    exporters: list[str] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def shutdown(self, timeout_s: float = 5.0) -> bool:
        """Export the spans still queued, within ``timeout_s``, and stop (graceful shutdown).

        Bounded like every shutdown step: an exporter that cannot deliver in time
        (collector down) is left behind on its daemon thread rather than holding
        the exit. True when everything was exported."""
        global _active
        provider, self.provider = self.provider, None
        if provider is None:
            return True
        _active = None
        flushed = provider.force_flush(timeout_millis=int(timeout_s * 1000))
        if flushed:
            provider.shutdown()
        else:
            log.warning("tracing: spans not exported within %.1fs; dropped", timeout_s)
        return flushed


def start_tracing(default_service: str, environ: Mapping[str, str] | None = None) -> Tracing:
    """Build the provider when ``OTEL_TRACES_EXPORTER`` asks for tracing; else do nothing."""
    global _active
    names = exporter_names(os.environ if environ is None else environ)
    if not names:
        return Tracing()
    configured_propagator()  # a misspelt OTEL_PROPAGATORS fails at start, not on the first record
    # Sampler, span limits and the batch processor's queue read their OTEL_* variables themselves.
    # shutdown_on_exit=False: Tracing.shutdown flushes, within a bound; the SDK's atexit hook
    # would wait up to 30 s for an unreachable collector.
    provider = TracerProvider(resource=_resource(default_service), shutdown_on_exit=False)
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    _active = provider.get_tracer(TRACER_NAME)
    log.info("tracing on: exporters %s, service %s", ", ".join(names), provider.resource.attributes.get(SERVICE_NAME))
    return Tracing(provider, names)


def active_tracer() -> Tracer | None:
    """The running process's tracer, or ``None`` when tracing is off."""
    return _active


@dataclass(frozen=True)
class CallSpan:
    """How a backend's batched call is traced: span name, kind and attributes."""

    name: str
    remote: bool
    """A call to another server (Triton: kind CLIENT, context sent in its metadata)."""
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)


_NO_SPAN: AbstractContextManager[object] = nullcontext()  # reusable: "off" allocates nothing per call


def call_span(
    call: CallSpan,
    parent: trace.Span | None,
    links: Sequence[trace.Span] = (),
    attributes: Mapping[str, AttributeValue] | None = None,
) -> AbstractContextManager[object]:
    """One span around a backend call, current while it runs (so :func:`grpc_metadata`
    sends it along), child of ``parent`` and linked to every span in ``links``
    (a batch serves several records, each with its own trace). Off: does nothing."""
    tracer = _active
    if tracer is None:
        return _NO_SPAN
    if parent is not None and not any(s.is_recording() for s in (parent, *links)):
        # No record of this call is sampled: no span, but Triton still gets the context
        # (sampled flag off), so its own tracing makes the same decision.
        return trace.use_span(parent, end_on_exit=False)
    return _call_span(tracer, call, parent, links, attributes)


@contextmanager
def _call_span(
    tracer: Tracer,
    call: CallSpan,
    parent: trace.Span | None,
    links: Sequence[trace.Span],
    attributes: Mapping[str, AttributeValue] | None,
) -> Iterator[None]:
    context = trace.set_span_in_context(parent) if parent is not None else None
    span = tracer.start_span(
        call.name,
        context=context,
        kind=SpanKind.CLIENT if call.remote else SpanKind.INTERNAL,
        attributes={**call.attributes, **(attributes or {})},
        links=[Link(s.get_span_context()) for s in links],
    )
    with trace.use_span(span, end_on_exit=True, record_exception=True, set_status_on_exception=True):
        yield


def grpc_metadata() -> dict[str, str] | None:
    """The current span's context as gRPC metadata (``traceparent``...), or None when off."""
    if _active is None:
        return None
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier or None
