"""The Prometheus metrics every stage reports, in one registry per process.

Names follow Prometheus conventions (``_total`` counters, ``_seconds``
histograms) and carry a ``stage`` label, so one scrape of a process running
several stages separates them. Every series, the process collectors' included,
also carries ``topology`` (:class:`~pipeline.observability.registry.LabelledRegistry`),
so one Prometheus scraping several topologies, or dashboards and alert rules
filtering on one, need no relabelling in the scrape configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from pipeline.observability.registry import LabelledRegistry

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class PipelineMetrics:
    """All collectors, registered on a private registry (never the global default).

    ``topology`` labels every series (empty: none, as in unit tests of one stage).
    """

    topology: str = ""
    registry: CollectorRegistry = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.registry = LabelledRegistry({"topology": self.topology})
        # CPU seconds, resident memory, open file descriptors, start time (Linux /proc), the
        # Python version and its garbage collector: what an operator checks first on a slow worker.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        # Every metric is labelled by stage first; the arguments after the help text name its other labels.
        counter, gauge, histogram = self._counter, self._gauge, self._histogram
        self.requests = counter("pipeline_requests_total", "Records consumed by a stage.")
        self.results = counter("pipeline_results_total", "Results produced by a stage.")
        self.dead_letters = counter(
            "pipeline_dead_letters_total", "Records sent to the dead-letter topic, by error class.", "error_class"
        )
        self.tenant_requests = counter(
            "pipeline_tenant_requests_total",
            "Records of a stage with tenant quotas, by tenant (capped: others are 'other') and "
            "outcome: served, delayed, quota-exceeded.",
            "tenant",
            "outcome",
        )
        self.reply_routes = counter(
            "pipeline_reply_routes_total",
            "Results whose request named a reply-topic: honoured, or why it was ignored (the result "
            "then went to the result topic).",
            "outcome",
        )
        self.triton_retries = counter(
            "pipeline_triton_retries_total", "Triton calls retried after UNAVAILABLE or a timeout."
        )
        self.triton_shared_memory = counter(
            "pipeline_triton_shared_memory_total",
            "Triton calls with tensors in system shared memory, by outcome: shm (sent so), "
            "fallback (refused or no region: sent inside the gRPC message), reregistered.",
            "outcome",
        )
        self.batch_size = histogram(_BATCH_BUCKETS, "pipeline_batch_size", "Rows per Triton call.")
        self.queue_delay = histogram(
            _LATENCY_BUCKETS,
            "pipeline_queue_delay_seconds",
            "Longest time a request of a batch waited in the batcher before the batch's call (one observation per call).",
        )
        self.triton_latency = histogram(
            _LATENCY_BUCKETS,
            "pipeline_triton_request_duration_seconds",
            "Duration of one batched Triton gRPC call.",
            "model",
        )
        self.end_to_end = histogram(
            _LATENCY_BUCKETS,
            "pipeline_end_to_end_latency_seconds",
            "From the request record's timestamp to its result being acknowledged by the broker.",
        )
        self.inflight_batches = gauge("pipeline_inflight_batches", "Triton calls in flight.")
        self.inflight_bytes = gauge(
            "pipeline_inflight_bytes", "Bytes of the request records inside the Triton calls in flight."
        )
        self.pending_requests = gauge(
            "pipeline_pending_requests",
            "Records consumed but not yet acknowledged downstream (bounded by backpressure).",
        )
        self.pending_bytes = gauge(
            "pipeline_pending_bytes",
            "Bytes of records consumed but not yet acknowledged downstream (bounded by backpressure).",
        )
        self.consumer_lag = gauge(
            "pipeline_consumer_lag",
            "Records between the consumer position and the partition end.",
            "topic",
            "partition",
        )
        self.consumer_group_lag = gauge(
            "pipeline_consumer_group_lag",
            "Sum of pipeline_consumer_lag over the partitions this process holds for the consumer "
            "group; sum by (group) across processes for the whole group's lag.",
            "group",
        )
        self.records_dropped = counter(
            "pipeline_records_dropped_total",
            "Records deliberately turned into no output, by documented reason (docs/message-contract.md).",
            "reason",
        )
        self.streams_closed = counter(
            "pipeline_streams_closed_total",
            "Streams closed without an end chunk: idle, evicted, or failed by the gap policy.",
            "reason",
        )
        self.upstream_state = gauge(
            "pipeline_upstream_state",
            "1 for the state a join's branch (for a sequence stage, its upstream: branch 'input') is in "
            "on this process's partitions, 0 for the others: behind, caught-up or gone "
            "(pipeline/kafka/progress.py).",
            "branch",
            "state",
        )
        self.join_expiries = counter(
            "pipeline_join_expiries_total",
            "Join windows closed before every branch arrived, by the rule that closed them: caught-up, "
            "event-time, gone, max-wait, or evicted (max_open_joins).",
            "rule",
        )
        self.stream_gaps = counter(
            "pipeline_stream_gaps_total", "Missing chunks a stream skipped (each marked by a 'gap' result)."
        )
        self.state_keys = gauge(
            "pipeline_state_keys",
            "Keyed states held by this process (open streams and their ended markers, open joins).",
        )
        self.state_evictions = counter(
            "pipeline_state_evictions_total",
            "Keyed states closed early because the stage held its maximum number of keys.",
        )
        self.state_corrupt = counter(
            "pipeline_state_corrupt_total",
            "State records that could not be decoded on restore (the key started fresh).",
        )
        self.claim_checks = counter(
            "pipeline_claim_checks_total",
            "Dead letters too large for the dead-letter topic, by outcome: payload stored in the "
            "S3 store (stored), or dropped because S3 is not configured or failed (not-kept).",
            "outcome",
        )
        self.unreadable_records = counter(
            "pipeline_unreadable_records_total",
            "Records the consumer could not decode (bad header key, CRC, structure), dead-lettered by position.",
            "cause",
        )
        self.offsets_skipped = counter(
            "pipeline_offsets_skipped_total",
            "Fetch answers that skipped an offset (a broker fault: pipeline.kafka.continuity); each one "
            "was fetched again, never moved past.",
            "topic",
            "partition",
        )
        self.offsets_absent = counter(
            "pipeline_offsets_absent_total",
            "Offsets every re-read showed missing from the broker's log (a hole, e.g. left by a broker "
            "crash), moved past after re-reading for 10 s (pipeline.kafka.continuity).",
            "topic",
            "partition",
        )
        self.fenced_outputs = counter(
            "pipeline_fenced_outputs_total",
            "Outputs (results, dead letters, checkpoints) held while this worker's group membership "
            "was unconfirmed, then dropped because its partitions moved (the new owner redoes them).",
        )
        self.device = gauge("pipeline_stage_device_info", "Where a stage computes (1 for its device).", "device")
        self.oldest_unfinished_age = gauge(
            "pipeline_oldest_unfinished_record_age_seconds",
            "Age of the oldest consumed record whose outcome the broker has not yet acknowledged "
            "(0: none pending); past the stage's stall_after_s, /readyz answers 503.",
            "topic",
            "partition",
        )
        self.stage_ready = gauge(
            "pipeline_stage_ready",
            "1 while the stage consumes and none of its partitions is stalled (its share of /readyz).",
        )
        self.paused = gauge("pipeline_consumer_paused", "1 while consumption is paused by backpressure.")
        self.lane_requests = counter(
            "pipeline_lane_requests_total", "Records consumed from each priority lane (workers/runtime/lanes.py).", "lane"
        )
        self.lane_held = gauge(
            "pipeline_lane_held",
            "1 while a priority lane is paused because a higher lane has records waiting.",
            "lane",
        )

    def _counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(name, documentation, ["stage", *labels], registry=self.registry)

    def _gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        return Gauge(name, documentation, ["stage", *labels], registry=self.registry)

    def _histogram(self, buckets: tuple[float, ...], name: str, documentation: str, *labels: str) -> Histogram:
        return Histogram(name, documentation, ["stage", *labels], buckets=buckets, registry=self.registry)

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
