"""Send request records to a topic, paced, counting what the broker acknowledged.

``send`` in aiokafka returns as soon as a record is queued; the broker's
acknowledgement arrives later on a future. Counting both tells a user the
difference between "I produced 10 000 records" and "Kafka has 10 000 records":
every record ends up either acknowledged or failed, never silently lost.

Two headers are stamped at the moment of sending, not when the record was
built, so a slow source or a paced run does not skew them: ``sent-at-ms``
(end-to-end latency, read back by ``pipeline consume``) and, with a relative
``deadline_ms``, the absolute ``deadline`` header of the contract.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiokafka.errors import KafkaError

from pipeline.contract import headers as h
from pipeline.contract.errors import one_line
from pipeline.contract.records import Record
from pipeline.errors import EndpointUnreachable
from pipeline.kafka.clients import make_producer
from pipeline.settings import KafkaSettings
from pipeline.tools.connect import start_client
from pipeline.tools.headers import SENT_AT_MS, now_ms
from pipeline.tools.pacing import Pacer

#: How long to wait for the broker (and the topic's metadata) before giving up with one line.
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SendOptions:
    """Pacing and per-send headers."""

    rate: float = 0.0
    """Records per second; 0 sends as fast as the broker takes them."""
    deadline_ms: int | None = None
    """Relative deadline: each record's ``deadline`` header is its send time plus this."""
    connect_timeout_s: float = CONNECT_TIMEOUT_S


@dataclass
class ProduceStats:
    """Counts and timing of one produce run (``planned`` is None for an open-ended source)."""

    topic: str
    planned: int | None = None
    sent: int = 0
    acknowledged: int = 0
    failed: int = 0
    first_error: str | None = None
    interrupted: bool = False
    started: float | None = None  # monotonic time of the first send
    finished: float | None = None  # monotonic time of the last acknowledgement or failure

    @property
    def pending(self) -> int:
        return self.sent - self.acknowledged - self.failed

    @property
    def elapsed_s(self) -> float:
        """From the first send to the last answer from the broker (so far)."""
        if self.started is None:
            return 0.0
        end = self.finished if self.finished is not None and not self.pending else time.monotonic()
        return max(end - self.started, 0.0)

    @property
    def rate(self) -> float:
        """Achieved send rate, records per second."""
        elapsed = self.elapsed_s
        return self.sent / elapsed if elapsed > 0 else 0.0

    def fail(self, error: BaseException | str) -> None:
        self.failed += 1
        self.finished = time.monotonic()
        if self.first_error is None:
            self.first_error = one_line(str(error) or type(error).__name__)


def stamp(record: Record, *, sent_at_ms: int, deadline_ms: int | None) -> list[tuple[str, bytes]]:
    """The record's headers plus ``sent-at-ms`` (and ``deadline`` = send time + ``deadline_ms``)."""
    extra = [(SENT_AT_MS, str(sent_at_ms))]
    if deadline_ms is not None:
        extra.append((h.DEADLINE, str(sent_at_ms + deadline_ms)))
    return h.replace_headers(record.headers, extra)


async def produce(
    records: Iterable[Record],
    *,
    topic: str,
    settings: KafkaSettings,
    options: SendOptions = SendOptions(),
    planned: int | None = None,
    on_progress: Callable[[ProduceStats], None] | None = None,
    on_connected: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
) -> ProduceStats:
    """Send ``records`` to ``topic`` and wait for every acknowledgement.

    Records are pulled from the iterable one at a time, so a generator source
    costs constant memory. ``stop`` (set by a signal handler) ends sending
    early; what was sent is still flushed and counted. ``on_connected`` runs
    once the broker has answered, before the first send. Raises
    :class:`~pipeline.errors.EndpointUnreachable` when the broker or the
    topic's metadata does not answer within ``options.connect_timeout_s``.
    """
    stats = ProduceStats(topic=topic, planned=planned)
    producer = make_producer(settings)
    await start_client(producer, settings, options.connect_timeout_s)
    if on_connected is not None:
        on_connected()
    pending: set[asyncio.Future[object]] = set()

    def settled(future: asyncio.Future[object]) -> None:
        pending.discard(future)
        if future.cancelled():
            stats.fail("cancelled")
        elif future.exception() is not None:
            stats.fail(future.exception())  # type: ignore[arg-type]
        else:
            stats.acknowledged += 1
            stats.finished = time.monotonic()

    pacer = Pacer(options.rate)
    try:
        for record in records:
            if stop is not None and stop.is_set():
                stats.interrupted = True
                break
            await pacer.wait()
            sent_at = now_ms()
            if stats.started is None:
                stats.started = time.monotonic()
            headers = stamp(record, sent_at_ms=sent_at, deadline_ms=options.deadline_ms)
            try:
                send = producer.send(topic, record.value, key=record.key, headers=headers)
                if stats.sent == 0:  # the first send fetches the topic's metadata: bound it
                    future = await asyncio.wait_for(send, options.connect_timeout_s)
                else:
                    future = await send
            except asyncio.TimeoutError:
                raise EndpointUnreachable(
                    f"no metadata for topic {topic!r} from Kafka at {settings.bootstrap_servers} "
                    f"within {options.connect_timeout_s:g} s"
                ) from None
            except KafkaError as exc:  # refused before queueing (e.g. record too large)
                stats.sent += 1
                stats.fail(exc)
                continue
            stats.sent += 1
            pending.add(future)
            future.add_done_callback(settled)
            if on_progress is not None:
                on_progress(stats)
        await producer.flush()
        if pending:
            await asyncio.wait(set(pending))
    finally:
        await producer.stop()
    if on_progress is not None:
        on_progress(stats)
    return stats
