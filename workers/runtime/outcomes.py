"""What a stage counts about its records: consumed, results, dead letters, retries, latency.

Labelled children are looked up once here: a label lookup per record costs microseconds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pipeline.failure_policy import Failure
from pipeline.kafka.outbox import OutRecord
from pipeline.observability.histograms import observe_many
from pipeline.observability.metrics import PipelineMetrics


class StageOutcomes:
    def __init__(self, stage: str, metrics: PipelineMetrics) -> None:
        self._stage = stage
        self._metrics = metrics
        self._requests = metrics.requests.labels(stage)
        self._results = metrics.results.labels(stage)
        self._end_to_end = metrics.end_to_end.labels(stage)
        self._retries = metrics.triton_retries.labels(stage)

    def consumed(self, count: int = 1) -> None:
        """``count`` records of one fetched partition batch were taken (one increment per batch)."""
        if count:
            self._requests.inc(count)

    def acknowledged(self, outs: Sequence[OutRecord]) -> None:
        """The broker has ``outs`` (a record batch's, or one slot's): count each as a result
        or a dead letter (the results with one increment), with its end-to-end latency (the
        histogram is per request, observed for the whole batch at once; one clock read)."""
        results = 0
        now_ms = time.time() * 1000
        latencies = []
        for out in outs:
            if not out.counts_as_result:
                continue
            if out.dead_letter:
                self._metrics.dead_letters.labels(self._stage, out.error_class or "unknown").inc()
            else:
                results += 1
            if out.request_timestamp_ms:
                latencies.append(max(now_ms - out.request_timestamp_ms, 0.0) / 1000)
        if results:
            self._results.inc(results)
        observe_many(self._end_to_end, latencies)

    def retried(self, failure: Failure) -> None:
        """``on_retry`` for :func:`pipeline.failure_policy.call_with_retry`: one metric for all."""
        self._retries.inc()
