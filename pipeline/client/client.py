"""The asyncio client: ``async with Client("topology.yaml") as c: r = await c.infer({...})``.

Request-reply over the topology's Kafka topics, as Triton's client futures or Spring
Kafka's ``ReplyingKafkaTemplate`` give it: each call registers a future under a fresh
correlation id, produces the request with a ``deadline`` header (now + timeout) and a
``reply-topic`` header naming this client's own reply topic, and the client's reader
resolves the future from the reply (a result, or a dead letter raised as
:class:`~pipeline.client.errors.RequestDeadLettered`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import secrets
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import TopicAuthorizationFailedError
from typing_extensions import Self

from pipeline.client.endpoint import TopologyEndpoint
from pipeline.client.errors import ClientClosed, ClientError, RequestDeadLettered, RequestTimedOut
from pipeline.client.inbox import Inbox
from pipeline.client.result import InferResult, text_headers
from pipeline.client.stream import StreamSession
from pipeline.client.waiters import ClientStats, Waiters
from pipeline.contract.records import Record
from pipeline.contract.reply import REPLY_TOPIC, reply_headers, reply_target
from pipeline.contract.request import WireForm, encode_request
from pipeline.errors import ConfigError
from pipeline.kafka.clients import ensure_topics, make_producer
from pipeline.runtime.stages import record_limits
from pipeline.settings import KafkaSettings
from pipeline.tools.connect import start_client
from pipeline.tools.decoding import Consumed
from pipeline.tools.headers import now_ms
from pipeline.tools.target import Target
from pipeline.topology.model import Topology

log = logging.getLogger(__name__)

ReplyMode = Literal["topic", "shared"]
#: How long a client's reply topic keeps records: replies are read within a call's timeout.
DEFAULT_REPLY_RETENTION_MS = 60 * 60 * 1000


@dataclass(frozen=True)
class ClientOptions:
    """How a :class:`Client` calls its topology (every field has a keyword of the same name)."""

    reply: ReplyMode = "topic"
    """``topic``: results come to this client's own reply topic; ``shared``: read the result
    topic and keep this client's results (for topologies whose stages predate reply topics)."""
    reply_topic: str | None = None
    """The reply topic (under ``<result_topic>.reply.``); default: a new one per client,
    deleted on close."""
    reply_partition: int | None = None
    """Ask for results on this partition of ``reply_topic`` (clients sharing one topic)."""
    timeout: float | None = 30.0
    """Default per-call timeout in seconds (None: wait forever, no ``deadline`` header)."""
    form: WireForm = WireForm.PROTOBUF
    reply_retention_ms: int = DEFAULT_REPLY_RETENTION_MS
    connect_timeout: float = 15.0


class Client:
    """Calls one topology over Kafka; many calls may be in flight at once."""

    def __init__(
        self, topology: Topology | str | os.PathLike[str], *, kafka: KafkaSettings | None = None, **options: Any
    ) -> None:
        self.endpoint = TopologyEndpoint.of(topology)
        self.options = ClientOptions(**options)
        self.client_id = secrets.token_hex(6)
        self._kafka = kafka
        self._waiters = Waiters()
        self._ids = iter(range(1, 1 << 62))
        self._producer: Any = None
        self._inbox: Inbox | None = None
        self._owned_reply_topic = False
        self.reply_topic: str | None = None
        if self.options.reply == "topic":
            self.reply_topic = self.options.reply_topic or f"{self.endpoint.reply_prefix}{self.client_id}"
            if not reply_target([(REPLY_TOPIC, self.reply_topic.encode())], self.endpoint.reply_prefix).honoured:
                raise ConfigError(f"reply topic {self.reply_topic!r} must start with {self.endpoint.reply_prefix!r}")
            self._owned_reply_topic = self.options.reply_topic is None
        elif self.options.reply != "shared":
            raise ConfigError(f"reply must be 'topic' or 'shared', not {self.options.reply!r}")
        self._reply_headers = (
            reply_headers(self.reply_topic, self.options.reply_partition) if self.reply_topic else []
        )

    @property
    def stats(self) -> ClientStats:
        """Sent, answered, timed out, and replies discarded as late, duplicate or foreign."""
        return self._waiters.stats

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> Self:
        """Connect, create the topics it uses (the topology's own as ``pipeline run`` does,
        and the reply topic), and start reading replies from their current end."""
        settings = self._kafka or Target(topology=self.endpoint.topology, model=None).kafka()
        self._kafka = settings
        topo = self.endpoint.topology
        limits = record_limits(topo, settings)
        timeout = self.options.connect_timeout
        configs = topo.kafka.topic_settings()
        await ensure_topics(
            settings, topo.topics(), partitions=topo.kafka.partitions,
            replication_factor=topo.kafka.replication_factor, limits=limits, configs=configs,
        )
        if self.reply_topic is not None:
            await ensure_topics(
                settings, [self.reply_topic], partitions=1, replication_factor=topo.kafka.replication_factor,
                limits=limits, configs={**configs, "retention.ms": str(self.options.reply_retention_ms)},
            )
        self._producer = make_producer(settings, limits=limits)
        await start_client(self._producer, settings, timeout)
        reads = [self.reply_topic or self.endpoint.result_topic]
        partitions = {t: await asyncio.wait_for(self._producer.partitions_for(t), timeout) for t in reads}
        dead_letters = await self._dead_letter_partitions(timeout)
        if dead_letters is not None:
            partitions[self.endpoint.dead_letter_topic] = dead_letters
        self._inbox = Inbox(
            settings, self._waiters, reply_topics=reads,
            dead_letter_topic=self.endpoint.dead_letter_topic if dead_letters is not None else None,
            own_reply_topic=self.reply_topic, limits=limits,
            committed_only=self.endpoint.topology.exactly_once,
        )
        await self._inbox.start(partitions, timeout)
        return self

    async def _dead_letter_partitions(self, timeout: float) -> set[int] | None:
        """The dead-letter topic's partitions; None where this client may not read it (a
        least-privilege client: a call whose request is dead-lettered then ends by its timeout)."""
        assert self._producer is not None
        topic = self.endpoint.dead_letter_topic
        try:
            partitions: set[int] = await asyncio.wait_for(self._producer.partitions_for(topic), timeout)
        except TopicAuthorizationFailedError:
            log.warning("not allowed to read the dead-letter topic %s: a call whose request is dead-lettered "
                        "ends by its timeout", topic)  # fmt: skip
            return None
        return partitions

    async def close(self) -> None:
        """Fail the calls still waiting, stop reading, and delete the reply topic it made."""
        self._waiters.fail_all(ClientClosed("the client was closed"))
        if self._inbox is not None:
            await self._inbox.stop()
            self._inbox = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._owned_reply_topic and self._kafka is not None:
            await _delete_topic(self._kafka, str(self.reply_topic))
            self._owned_reply_topic = False

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ calls
    async def infer(
        self,
        inputs: Mapping[str, Any] | np.ndarray,
        *,
        timeout: float | Literal["default"] | None = "default",
        correlation_id: str | None = None,
        datatypes: Mapping[str, str] | None = None,
        parameters: Mapping[str, bool | int | float | str] | None = None,
        requested_outputs: Sequence[str] = (),
        priority: int | None = None,
        lane: str | None = None,
    ) -> InferResult:
        """One request, its result, sent to ``lane``'s topic (None: the input topic; an unknown
        lane raises :class:`~pipeline.errors.ConfigError` naming the lanes). Raises :class:`RequestDeadLettered` (error class, reason,
        stage) or, after ``timeout`` s, :class:`RequestTimedOut` (its reply, when it comes,
        is discarded and counted in ``stats.late``)."""
        timeout_s = self.options.timeout if timeout == "default" else timeout
        assert not isinstance(timeout_s, str)
        topic = self.endpoint.lane_topic(lane)
        cid = correlation_id or self.next_id()
        record = encode_request(
            self._named(inputs), correlation_id=cid, form=self.options.form, datatypes=datatypes,
            parameters=parameters, requested_outputs=requested_outputs, priority=priority,
            deadline_ms=None if timeout_s is None else now_ms() + math.ceil(timeout_s * 1000),
            extra_headers=self._reply_headers,
        )
        return await self.call(record, cid, timeout_s, topic=topic)

    async def call(
        self, record: Record, correlation_id: str, timeout_s: float | None, *, topic: str | None = None
    ) -> InferResult:
        """Send an encoded request (to ``topic``, default the input topic) and wait for its
        outcome (``infer`` and streams use it)."""
        future = self._waiters.expect(correlation_id)
        try:
            consumed = await asyncio.wait_for(self._round_trip(record, future, topic), timeout_s)
        except asyncio.TimeoutError:
            self._waiters.give_up(correlation_id, timed_out=True)
            raise RequestTimedOut(correlation_id, timeout_s or 0.0) from None
        except BaseException:
            self._waiters.give_up(correlation_id, timed_out=False)
            raise
        return outcome(consumed)

    async def send(self, record: Record, topic: str | None = None) -> None:
        """Produce ``record`` to ``topic`` (default the input topic) and wait for the broker's acknowledgement."""
        if self._producer is None:
            raise ClientClosed("the client is not started: use 'async with Client(...)' or await start()")
        delivery = await self._producer.send(
            topic or self.endpoint.input_topic, record.value, key=record.key, headers=record.headers
        )
        self._waiters.stats.sent += 1  # handed to the producer: from here it may be answered
        await delivery

    async def _round_trip(self, record: Record, future: asyncio.Future[Consumed], topic: str | None) -> Consumed:
        await self.send(record, topic)
        return await future

    async def infer_many(
        self,
        inputs: Iterable[Mapping[str, Any] | np.ndarray] | AsyncIterable[Mapping[str, Any] | np.ndarray],
        *,
        max_in_flight: int = 64,
        timeout: float | Literal["default"] | None = "default",
        return_exceptions: bool = False,
        lane: str | None = None,
    ) -> AsyncIterator[InferResult | ClientError]:
        """Results in input order, with at most ``max_in_flight`` requests outstanding, sent to ``lane``.
        A failed call raises (the rest are cancelled), or with ``return_exceptions`` is
        yielded in its place as its :class:`ClientError`."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.endpoint.lane_topic(lane)  # an unknown lane fails here, before anything is sent
        window: collections.deque[asyncio.Task[InferResult]] = collections.deque()
        try:
            async for item in _aiter(inputs):
                window.append(asyncio.create_task(self.infer(item, timeout=timeout, lane=lane)))
                if len(window) >= max_in_flight:
                    yield await _settle(window.popleft(), return_exceptions)
            while window:
                yield await _settle(window.popleft(), return_exceptions)
        finally:
            for task in window:
                task.cancel()
            await asyncio.gather(*window, return_exceptions=True)

    def stream(self, key: str, *, timeout: float | Literal["default"] | None = "default") -> StreamSession:
        """A sequence (audio) stream under ``key``: ``async with c.stream(k) as s: await s.send(chunk)``."""
        return StreamSession(self, key, timeout=self.options.timeout if timeout == "default" else timeout)

    def next_id(self) -> str:
        """A correlation id unique to this client (``<client id>-<n>``)."""
        return f"{self.client_id}-{next(self._ids)}"

    @property
    def form(self) -> WireForm:
        return self.options.form

    @property
    def stream_summary(self) -> bool:
        return self.endpoint.stream_summary

    @property
    def reply_headers(self) -> list[tuple[str, bytes]]:
        return list(self._reply_headers)

    @property
    def waiters(self) -> Waiters:
        return self._waiters

    def _named(self, inputs: Mapping[str, Any] | np.ndarray) -> Mapping[str, Any]:
        """A bare array is the topology's one input tensor, when it names exactly one."""
        if isinstance(inputs, Mapping):
            return inputs
        if len(self.endpoint.input_names) != 1:
            raise TypeError("pass inputs as {tensor name: array}: this topology does not name a single input")
        return {self.endpoint.input_names[0]: inputs}


def outcome(consumed: Consumed) -> InferResult:
    """A reply as the call's return value, or its dead letter raised."""
    if consumed.dead_letter is not None:
        raise RequestDeadLettered(consumed.correlation_id or "", consumed.dead_letter, text_headers(consumed.headers))
    return InferResult.of(consumed)


async def _settle(task: asyncio.Task[InferResult], return_exceptions: bool) -> InferResult | ClientError:
    try:
        return await task
    except ClientError as exc:
        if return_exceptions:
            return exc
        raise


async def _aiter(items: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def _delete_topic(settings: KafkaSettings, topic: str) -> None:
    """Best effort: a reply topic left behind expires with its retention, it harms no one."""
    admin = AIOKafkaAdminClient(**settings.client_kwargs(), request_timeout_ms=10_000)
    try:
        await admin.start()
        await admin.delete_topics([topic])
    except Exception as exc:  # noqa: BLE001 - logged; closing must not fail on it
        log.warning("could not delete reply topic %s: %s", topic, exc)
    finally:
        await admin.close()
