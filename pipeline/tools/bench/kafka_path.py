"""Requests through the running topology: sent to its input topic, matched on its output topics.

One producer and one consumer serve the whole sweep. The consumer
(:func:`pipeline.tools.consumer.consume`, no group: it commits nothing and
moves nobody's offsets) reads the result and dead-letter topics from their
end, and is ready before the first request is sent, so no answer can be
missed. Each record it reads is classified once
(:func:`pipeline.tools.decoding.classify`) and handed to the request waiting
for its correlation id; latency is this process's monotonic clock from just
before ``send`` to the record's arrival here, what a client of the topology
sees. Answers for ids nobody waits for (a late result after its timeout, a
duplicate after a worker's replay, another client's traffic) are counted,
never matched twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from pipeline.contract import headers as h
from pipeline.contract.errors import one_line
from pipeline.errors import EndpointUnreachable
from pipeline.kafka.clients import make_producer
from pipeline.settings import KafkaSettings
from pipeline.tools.bench.stats import Outcome, StepStats
from pipeline.tools.bench.verify import OutputVerifier
from pipeline.tools.bench.workload import Workload
from pipeline.tools.connect import start_client
from pipeline.tools.consumer import ConsumeOptions, consume
from pipeline.tools.decoding import Consumed, Kind
from pipeline.tools.headers import now_ms
from pipeline.tools.producer import CONNECT_TIMEOUT_S, stamp
from pipeline.tools.sources import RecordBuilder, RecordOptions

Answer = tuple[Consumed | None, float, str | None]
"""(the record that answered, or None when the send failed; when it arrived; the send error)."""


class KafkaPath:
    """The pipeline path: ``await path.call(stats)`` is one request to the topology."""

    def __init__(
        self,
        kafka: KafkaSettings,
        input_topic: str,
        output_topics: list[str],
        workload: Workload,
        timeout_s: float,
    ) -> None:
        self.kafka = kafka
        self.input_topic = input_topic
        self.output_topics = output_topics
        self.rows = workload.rows
        self.timeout_s = timeout_s
        self.unmatched = 0
        """Answers read for no waiting request (late, duplicate, or not ours)."""
        self._verifier = OutputVerifier(workload.model)
        self._templates = workload.cycle()
        self._builder = RecordBuilder(RecordOptions(id_prefix="bench-"))
        self._pending: dict[str, asyncio.Future[Answer]] = {}
        self._producer: AIOKafkaProducer | None = None
        self._consumer: asyncio.Task[object] | None = None
        self._consumer_stop = asyncio.Event()

    async def start(self) -> None:
        """Connect both clients; return once the consumer's positions are resolved."""
        ready = asyncio.Event()
        self._consumer = asyncio.create_task(
            consume(
                self.output_topics,
                settings=self.kafka,
                options=ConsumeOptions(idle_timeout_s=None),
                on_record=self._answered,
                on_ready=lambda assigned, missing: ready.set(),
                stop=self._consumer_stop,
            )
        )
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait({self._consumer, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if self._consumer.done():  # it could not start: its one-line error
            self._consumer.result()
            raise EndpointUnreachable(f"the consumer of {', '.join(self.output_topics)} ended before it was ready")
        self._producer = make_producer(self.kafka)
        await start_client(self._producer, self.kafka, CONNECT_TIMEOUT_S)

    async def close(self) -> None:
        self._consumer_stop.set()
        if self._producer is not None:
            await self._producer.stop()
        if self._consumer is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._consumer, 5.0)

    async def call(self, stats: StepStats) -> None:
        """Send one request, wait for its answer (or the timeout) and record the outcome."""
        assert self._producer is not None, "start() first"
        record = self._builder.build(next(self._templates))
        correlation_id = h.get_header(record.headers, h.CORRELATION_ID)
        assert correlation_id is not None
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = answer
        sent = time.monotonic()
        stats.sent(sent)
        try:
            headers = stamp(record, sent_at_ms=now_ms(), deadline_ms=None)
            delivery = await self._producer.send(self.input_topic, record.value, key=record.key, headers=headers)
            delivery.add_done_callback(lambda d: self._delivered(d, answer))
            consumed, arrived, error = await asyncio.wait_for(answer, self.timeout_s)
        except KafkaError as exc:  # refused before it was queued
            stats.ended(Outcome.SEND_FAILED, time.monotonic(), error=one_line(str(exc) or type(exc).__name__))
            return
        except asyncio.TimeoutError:
            stats.ended(Outcome.MISSING, time.monotonic(), error=f"no answer within {self.timeout_s:g} s")
            return
        finally:
            self._pending.pop(correlation_id, None)
        if consumed is None:
            stats.ended(Outcome.SEND_FAILED, arrived, error=error)
            return
        outcome, problem = self._judge(consumed)
        stats.ended(outcome, arrived, latency_ms=(arrived - sent) * 1000, error=problem)

    def _judge(self, consumed: Consumed) -> tuple[Outcome, str | None]:
        if consumed.kind is Kind.DEAD_LETTER and consumed.dead_letter is not None:
            letter = consumed.dead_letter
            return Outcome.DEAD_LETTER, f"dead letter from {letter.stage}: {letter.error_class}: {letter.reason}"
        if consumed.kind is not Kind.RESULT:
            return Outcome.INVALID, f"{consumed.kind} on {consumed.topic}: {consumed.problem or 'not a result'}"
        problem = self._verifier.problem(consumed.tensors, consumed.datatypes, self.rows)
        return (Outcome.INVALID, problem) if problem else (Outcome.VERIFIED, None)

    def _answered(self, consumed: Consumed) -> None:
        waiting = self._pending.get(consumed.correlation_id or "")
        if waiting is None or waiting.done():
            self.unmatched += 1
            return
        waiting.set_result((consumed, time.monotonic(), None))

    @staticmethod
    def _delivered(delivery: asyncio.Future[object], answer: asyncio.Future[Answer]) -> None:
        if answer.done() or delivery.cancelled():
            return
        failure = delivery.exception()
        if failure is not None:
            answer.set_result((None, time.monotonic(), one_line(str(failure) or type(failure).__name__)))

