"""The stateless stage's own logic in memory: no broker, no Triton, milliseconds per test.

:class:`workers.stateless.stage.BatchingStage` runs for real here: its intake, dynamic batcher,
failure policy (outage waits, transient retries, the per-request split of a failed batch,
dead letters) and the real :class:`pipeline.kafka.outbox.Outbox` (ordering, commits). Only
what lies behind the stage's seams is faked:

- the backend (:class:`ScriptedBackend`, the :class:`workers.stateless.backend.BatchBackend` the stage
  calls), scriptable per call: served from its inputs (after a delay, if scripted), or
  raising one of the error kinds the failure policy tells apart;
- the aiokafka clients the outbox calls (:class:`FakeProducer` ``send``, :class:`FakeConsumer`
  ``commit``): they record what would be produced and committed, and acknowledge at once.

The harness feeds records the way ``StreamStage._take`` does (``outbox.track`` and ``accept``
per record, one count per fetch, then one ``tick``) and shuts down the way ``StreamStage._drain`` does
(``release``, ``flush``, ``commit``). Two seams are not public, so it reaches them directly:
``StreamStage.start`` builds the clients and the outbox itself (and asks a broker first), so
the outbox is put in ``stage._outbox``; and the consume loop's per-record body is not a
callable unit without a consumer, so :meth:`StageHarness.feed` restates it. An unexpected
exception from ``accept`` propagates here (the loop would dead-letter it as an internal error): a test
should fail loudly on a stage bug. The outbox sends record by record (``batch_sends=False``):
record batches need aiokafka's batch builder and cluster metadata; they change how outputs
are handed over, not their order or the commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition

from pipeline.contract import headers as h
from pipeline.contract.errors import ErrorClass
from pipeline.contract.records import DeadLetter, Record, read_dead_letter
from pipeline.contract.request import InferenceRequest, encode_request
from pipeline.contract.response import InferenceResponse, decode_response
from pipeline.failure_policy import Failure, FailureKind
from pipeline.kafka.outbox import Outbox
from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.tracing import CallSpan
from pipeline.settings import KafkaSettings
from workers.runtime.stage_io import StageIO
from workers.stateless.backend import BatchOutput
from workers.stateless.features import FeatureParts
from workers.stateless.stage import BatchingSettings, BatchingStage

INPUT = "requests"
OUTPUT = "results"
DEAD_LETTERS = "dead-letters"


# ------------------------------------------------------------------ the backend
class Outage(Exception):
    """The server is down: the policy waits, holding the batch, and dead-letters nothing."""


class Transient(Exception):
    """A live server said "not now": retried up to ``RetryPolicy.max_attempts``."""


class BadRow(Exception):
    """The requests' fault (raised for a batch holding a poisoned row): a batch of several is
    split into one call per request, so only the culprit is dead-lettered."""


Compute = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
Step = BaseException | float | None
"""One scripted call: raise this exception, or serve after this many seconds (None: at once)."""


def row_sums(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The default model: ``scores`` is each row's sum of ``features``, so a result shows
    whose row it was computed from."""
    return {"scores": inputs["features"].sum(axis=1, keepdims=True).astype(np.float32)}


@dataclass(frozen=True)
class Call:
    """One call the stage made: whose requests, how many rows, and how it ended."""

    ids: tuple[str, ...]
    rows: int
    failed: str | None  # the exception's class name; None: served


class ScriptedBackend:
    """A :class:`workers.stateless.backend.BatchBackend` whose calls follow a script.

    Each call takes the next ``script`` step (then serves normally); while ``down`` every call
    is an outage; a batch holding a request whose correlation ID is in ``poison`` fails with
    :class:`BadRow`. Served calls compute the whole batch with ``compute`` in one go and split
    the rows back per request, as a batched model does.
    """

    name = "fake-model"
    device: str | None = None
    call_span = CallSpan("fake-model infer", remote=False)

    def __init__(
        self,
        compute: Compute = row_sums,
        *,
        max_batch_size: int = 0,
        script: Iterable[Step] = (),
        poison: Iterable[str] = (),
    ) -> None:
        self.compute = compute
        self.max_batch_size = max_batch_size
        self.script: deque[Step] = deque(script)
        self.poison = set(poison)
        self.down = False
        self.calls: list[Call] = []
        self.finished: list[Call] = []  # served calls, in the order they returned

    async def setup(self) -> int:
        return self.max_batch_size

    async def close(self) -> None:
        return None

    async def warmup(self) -> None:
        return None

    def check(self, request: InferenceRequest) -> object:
        return None

    def rows(self, request: InferenceRequest) -> int:
        return int(next(iter(request.inputs.values())).shape[0]) if request.inputs else 1

    def batch_key(self, request: InferenceRequest) -> Hashable:
        return tuple((name, request.datatypes[name], array.shape[1:]) for name, array in request.inputs.items())

    async def run(self, requests: Sequence[InferenceRequest], prepared: Sequence[object]) -> BatchOutput:
        ids = tuple(r.correlation_id for r in requests)
        rows = [self.rows(r) for r in requests]
        step = self.script.popleft() if self.script else None
        error: BaseException | None = step if isinstance(step, BaseException) else None
        if self.down:
            error = Outage("server not ready")
        elif error is None and (bad := self.poison.intersection(ids)):
            error = BadRow(f"model failed on row of {sorted(bad)[0]}")
        self.calls.append(Call(ids, sum(rows), type(error).__name__ if error is not None else None))
        if error is not None:
            raise error
        if isinstance(step, float):
            await asyncio.sleep(step)
        names = requests[0].inputs
        batch = {name: np.concatenate([r.inputs[name] for r in requests]) for name in names}
        outputs = self.compute(batch)
        split, start = [], 0
        for n in rows:
            split.append({name: array[start : start + n] for name, array in outputs.items()})
            start += n
        self.finished.append(self.calls[-1])
        return BatchOutput(split, self.name, "1")

    async def classify(self, exc: BaseException) -> Failure:
        if isinstance(exc, Outage):
            return Failure(FailureKind.OUTAGE, ErrorClass.MODEL_UNAVAILABLE, str(exc))
        if isinstance(exc, Transient):
            return Failure(FailureKind.TRANSIENT, ErrorClass.MODEL_UNAVAILABLE, str(exc))
        return Failure(FailureKind.PERMANENT, ErrorClass.INFERENCE_FAILED, f"{type(exc).__name__}: {exc}")


# ------------------------------------------------------------------ the Kafka clients
@dataclass(frozen=True)
class Produced:
    """One record the outbox handed to the producer."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


class FakeProducer:
    """``AIOKafkaProducer.send`` as the outbox calls it; every record is acknowledged at once."""

    def __init__(self) -> None:
        self.sent: list[Produced] = []

    async def send(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, headers: Any = None, **_: Any
    ) -> asyncio.Future[None]:
        self.sent.append(Produced(topic, key, value, list(headers or ())))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class FakeConsumer:
    """``AIOKafkaConsumer.commit`` as the outbox calls it: records each commit."""

    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        self.commits.append({tp: meta.offset for tp, meta in offsets.items()})


# ------------------------------------------------------------------ requests
def feature_requests(count: int, *, width: int = 4, rows: int = 1, first: int = 0) -> list[Record]:
    """``count`` real request records (protobuf form, correlation IDs ``c<i>``) whose
    ``features`` differ per request, so each result can be traced to its row."""
    return [
        encode_request(
            {"features": np.full((rows, width), float(i), dtype=np.float32)}, correlation_id=f"c{i}"
        )
        for i in range(first, first + count)
    ]


# ------------------------------------------------------------------ the harness
@dataclass
class StageHarness:
    """A started :class:`BatchingStage` with its real outbox over fake clients."""

    stage: BatchingStage
    backend: ScriptedBackend
    producer: FakeProducer
    consumer: FakeConsumer
    outbox: Outbox
    _offsets: dict[int, int] = field(default_factory=dict)

    async def feed(self, records: Iterable[Record], *, partition: int = 0) -> None:
        """One fetch's records into the stage, as the consume loop hands them over: each
        tracked in the outbox and handled with its slot, then one ``tick``."""
        taken = 0
        for record in records:
            consumed = self._consumed(record, partition)
            slot = self.outbox.track(consumed)
            taken += 1
            self.stage.passing(consumed)
            if (waiting := self.stage.accept(consumed, slot)) is not None:
                await self.stage.fence.guard(waiting)
        self.stage.outcomes.consumed(taken)
        await self.stage.fence.guard(self.stage.tick())

    async def pump(self, until: Callable[[], bool] | None = None, *, timeout_s: float = 1.0) -> None:
        """The consume loop's idle turns: tick when the stage says, produce what is ready,
        commit; until ``until()`` (default: every tracked record acknowledged)."""
        done = until or (lambda: self.outbox.pending() == 0)
        deadline = time.monotonic() + timeout_s
        while True:
            await self.stage.fence.guard(self.stage.tick())
            await self.outbox.flush(timeout_s)
            await self.outbox.commit()
            self.outbox.raise_if_failed()
            if done():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"stage not done in {timeout_s}s: {self.outbox.pending()} pending")
            await asyncio.sleep(min(self.stage.next_tick_s(), 0.001))

    async def drain(self) -> None:
        """Shutdown as the stage runs it: release every open batch, wait, produce, commit."""
        await self.stage.release(None)
        await self.outbox.flush(self.stage.io.drain_timeout_s)
        await self.outbox.commit()
        self.outbox.raise_if_failed()

    # ------------------------------------------------------------------ what came out
    def keys(self) -> list[tuple[str, str]]:
        """(topic, key) of every produced record, in produce order."""
        return [(p.topic, (p.key or b"").decode()) for p in self.producer.sent]

    def results(self) -> list[InferenceResponse]:
        return [decode_response(p.value, p.headers) for p in self.producer.sent if p.topic == OUTPUT]

    def dead_letters(self) -> list[tuple[str, DeadLetter]]:
        """(correlation ID, what the ``error-*`` headers say) per dead letter, in order."""
        return [
            (h.get_header(p.headers, h.CORRELATION_ID) or "", read_dead_letter(p.headers))
            for p in self.producer.sent
            if p.topic == DEAD_LETTERS
        ]

    def committed(self, partition: int = 0) -> int | None:
        """The last offset committed for an input partition (the next one to consume)."""
        tp = TopicPartition(INPUT, partition)
        offsets = [c[tp] for c in self.consumer.commits if tp in c]
        return offsets[-1] if offsets else None

    def _consumed(self, record: Record, partition: int) -> Any:
        offset = self._offsets.get(partition, 0)
        self._offsets[partition] = offset + 1
        value, key = record.value, record.key
        return ConsumerRecord(
            INPUT, partition, offset, int(time.time() * 1000), 0, key, value, None,
            len(key or b""), len(value), list(record.headers),
        )  # fmt: skip


@contextlib.asynccontextmanager
async def stage_harness(
    backend: ScriptedBackend,
    settings: BatchingSettings,
    *,
    parts: FeatureParts = FeatureParts(),
) -> AsyncIterator[StageHarness]:
    """A set-up stage over ``backend`` (with the features of ``parts``: a tensor map, padding,
    ...); on exit its running batches are cancelled and it is torn down (what is still
    unfinished stays uncommitted, as on a real shutdown)."""
    io = StageIO("classify", "classify-group", INPUT, OUTPUT, DEAD_LETTERS, drain_timeout_s=1.0, close_timeout_s=0.5)
    stage = BatchingStage(io, backend, settings, kafka=KafkaSettings(), metrics=PipelineMetrics(), parts=parts)
    producer, consumer = FakeProducer(), FakeConsumer()
    outbox = Outbox(producer, consumer, on_acknowledged=stage.outcomes.acknowledged, batch_sends=False)
    stage._outbox = outbox  # StreamStage.start() would build it with real clients (seam: see the module docstring)
    await stage.setup()
    try:
        yield StageHarness(stage, backend, producer, consumer, outbox)
    finally:
        await stage.abandon()
        await stage.teardown()
