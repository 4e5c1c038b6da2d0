"""The Prometheus metrics every stage reports, in one registry per process.

Names follow Prometheus conventions (``_total`` counters, ``_seconds``
histograms) and carry a ``stage`` label, so one scrape of a process running
several stages separates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class PipelineMetrics:
    """All collectors, registered on a private registry (never the global default)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "pipeline_requests_total", "Records consumed by a stage.", ["stage"], registry=r
        )
        self.results = Counter(
            "pipeline_results_total", "Results produced by a stage.", ["stage"], registry=r
        )
        self.dead_letters = Counter(
            "pipeline_dead_letters_total",
            "Records sent to the dead-letter topic, by error class.",
            ["stage", "error_class"],
            registry=r,
        )
        self.triton_retries = Counter(
            "pipeline_triton_retries_total",
            "Triton calls retried after UNAVAILABLE or a timeout.",
            ["stage"],
            registry=r,
        )
        self.batch_size = Histogram(
            "pipeline_batch_size", "Rows per Triton call.", ["stage"], buckets=_BATCH_BUCKETS, registry=r
        )
        self.queue_delay = Histogram(
            "pipeline_queue_delay_seconds",
            "Time a request waited in the batcher before its Triton call.",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.triton_latency = Histogram(
            "pipeline_triton_request_duration_seconds",
            "Duration of one batched Triton gRPC call.",
            ["stage", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.end_to_end = Histogram(
            "pipeline_end_to_end_latency_seconds",
            "From the request record's timestamp to its result being acknowledged by the broker.",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inflight_batches = Gauge(
            "pipeline_inflight_batches", "Triton calls in flight.", ["stage"], registry=r
        )
        self.pending_requests = Gauge(
            "pipeline_pending_requests",
            "Records consumed but not yet acknowledged downstream (bounded by backpressure).",
            ["stage"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            "pipeline_consumer_lag",
            "Records between the consumer position and the partition end.",
            ["stage", "topic", "partition"],
            registry=r,
        )
        self.duplicates_dropped = Counter(
            "pipeline_duplicate_chunks_dropped_total",
            "Stream chunks dropped as exact duplicates of chunks already applied.",
            ["stage"],
            registry=r,
        )
        self.idle_closed = Counter(
            "pipeline_streams_closed_idle_total", "Streams closed after their idle timeout.", ["stage"], registry=r
        )
        self.state_keys = Gauge(
            "pipeline_state_keys",
            "Keyed states held by this process (open streams and their ended markers, open joins).",
            ["stage"],
            registry=r,
        )
        self.state_evictions = Counter(
            "pipeline_state_evictions_total",
            "Keyed states closed early because the stage held its maximum number of keys.",
            ["stage"],
            registry=r,
        )
        self.state_corrupt = Counter(
            "pipeline_state_corrupt_total",
            "State records that could not be decoded on restore (the key started fresh).",
            ["stage"],
            registry=r,
        )
        self.device = Gauge(
            "pipeline_stage_device_info", "Where a stage computes (1 for its device).", ["stage", "device"], registry=r
        )
        self.paused = Gauge(
            "pipeline_consumer_paused", "1 while consumption is paused by backpressure.", ["stage"], registry=r
        )

    def snapshot(self) -> dict[str, list[dict[str, object]]]:
        """Current samples as plain data, for the metrics topic."""
        out: dict[str, list[dict[str, object]]] = {}
        for family in self.registry.collect():
            out[family.name] = [
                {"name": s.name, "labels": dict(s.labels), "value": s.value}
                for s in family.samples
                if not s.name.endswith("_created")
            ]
        return out
