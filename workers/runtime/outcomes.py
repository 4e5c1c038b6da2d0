"""What a stage counts about its records: consumed, results, dead letters, retries, latency.

Labelled children are looked up once here: a label lookup per record costs microseconds.
"""

from __future__ import annotations

import time

from pipeline.failure_policy import Failure
from pipeline.kafka.outbox import OutRecord
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

    def acknowledged(self, out: OutRecord) -> None:
        """The broker has ``out``: count it as a result or a dead letter, with its latency."""
        if not out.counts_as_result:
            return
        if out.dead_letter:
            self._metrics.dead_letters.labels(self._stage, out.error_class or "unknown").inc()
        else:
            self._results.inc()
        if out.request_timestamp_ms:
            self._end_to_end.observe(max(time.time() - out.request_timestamp_ms / 1000, 0.0))

    def retried(self, failure: Failure) -> None:
        """``on_retry`` for :func:`pipeline.failure_policy.call_with_retry`: one metric for all."""
        self._retries.inc()
