"""Backpressure for one stage's consumer: pause when too much is held, resume at half.

"Held" is what was consumed and has no acknowledged outcome yet, counted two ways:
records (``max_pending``) and bytes (``max_pending_bytes``), so neither 4,096 tiny
records nor a handful of 64 MiB ones can exhaust memory. The consumer is paused,
not stopped: the stage keeps polling, which keeps its group membership alive.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer

from pipeline.observability.metrics import PipelineMetrics


class FlowControl:
    """Decides pause/resume from what the outbox holds; exports the gauges."""

    def __init__(self, stage: str, metrics: PipelineMetrics, *, max_pending: int, max_pending_bytes: int) -> None:
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.paused = False
        self._pending = metrics.pending_requests.labels(stage)
        self._pending_bytes = metrics.pending_bytes.labels(stage)
        self._paused_gauge = metrics.paused.labels(stage)

    def update(self, consumer: AIOKafkaConsumer, pending: int, pending_bytes: int) -> int:
        """Pause or resume ``consumer``; returns how many more records may be fetched now."""
        room = self.max_pending - pending
        self._pending.set(pending)
        self._pending_bytes.set(pending_bytes)
        if room <= 0 or pending_bytes >= self.max_pending_bytes:
            if not self.paused:
                consumer.pause(*consumer.assignment())
                self.paused = True
                self._paused_gauge.set(1)
        elif self.paused and room >= self.max_pending // 2 and pending_bytes < self.max_pending_bytes // 2:
            consumer.resume(*consumer.assignment())
            self.paused = False
            self._paused_gauge.set(0)
        return room
