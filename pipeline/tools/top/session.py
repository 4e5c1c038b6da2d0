"""The ``pipeline top`` loop: read the metrics topic, hand a frame to the screen, repeat.

The screen is a callback (:mod:`pipeline.cli.top` chooses a live view on a terminal,
plain lines otherwise), so this loop is the same for both and for ``--once``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pipeline.settings import KafkaSettings
from pipeline.tools.top.book import Frame, SnapshotBook
from pipeline.tools.top.reader import MetricsReader
from pipeline.topology.model import Topology

LOOKBACK_INTERVALS = 10
"""How far back the first read starts, in metrics intervals: a live process's last two
snapshots are in it, and a process gone for up to this long shows as stale."""
ONCE_TIMEOUT_S = 10.0


async def run_top(
    topology: Topology,
    kafka: KafkaSettings,
    *,
    refresh_s: float,
    once: bool,
    show: Callable[[Frame], None],
    stop: asyncio.Event,
) -> None:
    """Show frames every ``refresh_s`` until ``stop`` (or one, caught up, with ``once``)."""
    book = SnapshotBook(topology.name, topology.metrics_interval_s)
    reader = MetricsReader(kafka, topology.metrics_topic, LOOKBACK_INTERVALS * topology.metrics_interval_s)
    await reader.start()
    try:
        await reader.catch_up(book, ONCE_TIMEOUT_S)
        show(book.frame(_now_ms()))
        while not once and not stop.is_set():
            await reader.read_for(book, refresh_s, stop)
            if not stop.is_set():
                show(book.frame(_now_ms()))
    finally:
        await reader.stop()


def _now_ms() -> int:
    return int(time.time() * 1000)
