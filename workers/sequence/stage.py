"""The sequence stage: stateful streams pinned by key, driven through Triton's sequence batcher.

Affinity: the Kafka key is the stream key, so every chunk of a stream lands in
one partition and therefore at one worker; the stream maps to one Triton
``sequence_id`` (a hash of the key), so Triton routes it to one sequence slot.

Per stream, one task applies chunks in ``chunk_index`` order
(:func:`workers.sequence.chunks.placement`): frames them into the model's window
(carrying the remainder), runs each frame through :class:`SequenceModel`, and
completes the chunk's slot with its results, the post-processor's results and
the stream's checkpoint. A chunk is never applied twice, across crashes too,
because the digests of applied chunks are part of the checkpoint.

Crash consistency (argued in docs/streaming.md): the checkpoint is written
through the keyed state store *after* the chunk's results are acknowledged and
the input offset is committed after both; a new owner restores the state of its
partitions before consuming them; replayed chunks at or below the checkpoint are
exact duplicates and are dropped, the rest are recomputed from exactly the
checkpointed state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import numpy as np
from aiokafka.structs import TopicPartition

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.failure_policy import Failure, GaveUp
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs, OutRecord
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings, TritonSettings
from pipeline.state import StateLimits
from workers.base import StageIO, StreamStage
from workers.sequence.chunks import CHUNK_INDEX, Chunk, Placement, parse_chunk, placement
from workers.sequence.model import SequenceModel, StreamHandle
from workers.sequence.postprocess import NoPostProcessing, PostProcessor, VadSegments
from workers.sequence.results import Origin, ResultWriter
from workers.sequence.settings import SequenceSettings
from workers.sequence.state import StreamState, StreamStateCodec, frame

log = logging.getLogger(__name__)

_SWEEP_S = 0.5


@dataclass
class _Stream:
    """In-memory side of a stream: its queue of chunks and its worker task."""

    handle: StreamHandle
    partition: TopicPartition
    queue: asyncio.Queue[Chunk] = field(default_factory=asyncio.Queue)
    waiting: dict[int, Chunk] = field(default_factory=dict)  # arrived early, by index
    task: asyncio.Task[None] | None = None
    origin: Origin | None = None  # the latest chunk's key/request/headers, for a closing summary

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()


class SequenceStage(StreamStage):
    """Stateful streams through a Triton sequence model, with Kafka-backed state."""

    def __init__(
        self,
        io: StageIO,
        settings: SequenceSettings,
        *,
        state_topic: str,
        kafka: KafkaSettings,
        triton: TritonSettings,
        metrics: PipelineMetrics,
    ) -> None:
        super().__init__(io, kafka, metrics)
        self.settings = settings
        self.model = SequenceModel(
            triton,
            settings.model,
            settings.model_version,
            model_input=settings.model_input,
            state_map=settings.state_map,
            max_inflight=settings.max_inflight_requests,
            retry=settings.retry,
        )
        self.idle_timeout_s = settings.idle_timeout_s or 60.0
        self.states = self.keyed_state(
            state_topic, StreamStateCodec(), ttl_s=self.idle_timeout_s, max_keys=settings.max_streams
        )
        self.post: PostProcessor = NoPostProcessing()
        self.results = ResultWriter(io, model_name=settings.model)
        self._streams: dict[bytes, _Stream] = {}
        self._last_sweep = time.monotonic()

    # ------------------------------------------------------------------ setup
    async def setup(self) -> None:
        d = await self.model.setup(self.io.stage)
        if self.settings.idle_timeout_s is None:
            idle_us = d.sequence_batching.max_sequence_idle_microseconds if d.sequence_batching else 0
            self.idle_timeout_s = idle_us / 1e6 if idle_us else 60.0
            self.states.limits = StateLimits(ttl_s=self.idle_timeout_s, max_keys=self.settings.max_streams)
        if self.settings.vad is not None:
            self.post = VadSegments(
                self.settings.vad, frame_size=self.model.frame_size, sample_rate=self.settings.sample_rate
            )
        self.results = ResultWriter(self.io, model_name=d.name, model_version=self.model.version)
        log.info(
            "%s: sequence model %s ready (frames of %d samples at %d Hz, idle %.1fs, state %s)",
            self.io.stage, d.name, self.model.frame_size, self.settings.sample_rate, self.idle_timeout_s,
            self.settings.state_map or "in Triton only",
        )

    async def teardown(self) -> None:
        await self.model.close()

    # ------------------------------------------------------------------ ownership
    async def restore(self, partitions: list[TopicPartition]) -> None:
        report = await self.states.restore(tp.partition for tp in partitions)
        for _ in report.corrupt:
            self.metrics.state_corrupt.labels(self.io.stage).inc()
        for stream in self._streams.values():
            stream.handle.live_in_triton = False
        log.info("%s: restored %d stream states for %s", self.io.stage, report.restored, report.partitions)

    async def forget(self, partitions: list[TopicPartition]) -> None:
        gone = set(partitions)
        for key, stream in list(self._streams.items()):
            if stream.partition in gone:
                if stream.task is not None:
                    stream.task.cancel()
                del self._streams[key]
        self.states.forget(tp.partition for tp in partitions)

    # ------------------------------------------------------------------ per record
    async def handle(self, record: ConsumedRecord, slot: Slot[Outputs]) -> None:
        try:
            chunk = parse_chunk(record, slot, self.settings.input_tensor)
        except BadRequest as bad:
            self.dead_letter(record, slot, bad.error_class, bad.reason)
            return
        key = record.key or b""
        stream = self._streams.get(key)
        if stream is None:
            await self._evict_for(key)
            stream = self._streams[key] = _Stream(StreamHandle(key), TopicPartition(record.topic, record.partition))
        self.states.touch(key)  # activity: the idle clock restarts
        stream.origin = Origin.of(chunk)
        stream.queue.put_nowait(chunk)
        if not stream.busy:
            stream.task = asyncio.create_task(self._drive(stream), name=f"{self.io.stage}-stream")

    async def _drive(self, stream: _Stream) -> None:
        """Apply the stream's chunks in index order until its queue is empty."""
        while not stream.queue.empty():
            await self._place(stream, stream.queue.get_nowait())

    async def _place(self, stream: _Stream, chunk: Chunk) -> None:
        where, reason = placement(self.states.get(stream.handle.key), chunk, stream.waiting, self.settings.reorder_window)
        if where is Placement.REJECT:
            self._reject(chunk, reason)
        elif where is Placement.DUPLICATE:
            self.metrics.duplicates_dropped.labels(self.io.stage).inc()
            self.outbox.complete(chunk.slot, ())  # exact duplicate (or too old to differ): nothing to do
        elif where is Placement.WAIT:
            stream.waiting[chunk.index] = chunk  # wait for the gap to fill
        else:
            await self._apply(stream, chunk)
            while (state := self.states.get(stream.handle.key)) is not None and state.next_index in stream.waiting:
                await self._apply(stream, stream.waiting.pop(state.next_index))

    def _reject(self, chunk: Chunk, reason: str) -> None:
        self.dead_letter(chunk.record, chunk.slot, ErrorClass.MALFORMED_REQUEST, reason)

    async def _apply(self, stream: _Stream, chunk: Chunk) -> None:
        key, partition = stream.handle.key, chunk.record.partition
        state = self.states.get(key) or StreamState(key=key.decode("utf-8", "replace"))
        work = state.copy()  # kept only when the whole chunk succeeds
        frames, work.carry = frame(work.carry, chunk.samples, self.model.frame_size)
        ending = chunk.request.sequence_end
        if ending and (work.carry.size or not frames):
            frames.append(np.pad(work.carry, (0, self.model.frame_size - work.carry.size)))  # last, zero-padded
            work.carry = np.zeros(0, np.float32)
        try:
            outputs = await self._infer_frames(stream, work, frames, ending)
        except GaveUp as gave_up:
            state.remember(chunk.index, chunk.payload)
            state.next_index += 1  # the stream goes on without this chunk; it is dead-lettered
            self.states.put(key, state, partition)
            self.dead_letter(chunk.record, chunk.slot, gave_up.failure.error_class, gave_up.failure.reason)
            return
        work.samples_in += chunk.samples.size
        work.next_index = chunk.index + 1
        work.remember(chunk.index, chunk.payload)
        origin = Origin.of(chunk)
        tensors = self._frame_tensors(work, outputs)
        records = [self.results.result(origin, tensors, {CHUNK_INDEX: chunk.index}, "chunk")]
        emissions = self.post.on_frames(work, outputs, chunk_index=chunk.index, ending=ending)
        records += [self.results.emission(origin, e) for e in emissions]
        work.ended = ending
        ttl = self.settings.ended_retention_s if ending else None
        records.append(self.states.put(key, work, partition, ttl_s=ttl))
        self.outbox.complete(chunk.slot, tuple(records))

    async def _infer_frames(
        self, stream: _Stream, work: StreamState, frames: list[np.ndarray], ending: bool
    ) -> list[dict[str, np.ndarray]]:
        results = []
        for i, window in enumerate(frames):
            results.append(
                await self.model.infer(
                    stream.handle,
                    window,
                    resume_state=work.model_state,
                    resuming=work.frames_done > 0,
                    end=ending and i == len(frames) - 1,
                    on_retry=self._count_retry,
                )
            )
            for state_output in self.settings.state_map.values():
                work.model_state[state_output] = np.asarray(results[-1][state_output], dtype=np.float32)
            work.frames_done += 1
        return results

    def _count_retry(self, failure: Failure) -> None:
        self.metrics.triton_retries.labels(self.io.stage).inc()

    def _frame_tensors(self, work: StreamState, outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        tensors = {
            name: np.stack([np.asarray(o[name]) for o in outputs]) if outputs else np.zeros((0,), np.float32)
            for name in self.model.result_outputs
        }
        tensors["frame_index"] = np.arange(work.frames_done - len(outputs), work.frames_done, dtype=np.int64)
        return tensors

    # ------------------------------------------------------------------ time
    async def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < _SWEEP_S:
            return
        self._last_sweep = now
        for stream in list(self._streams.values()):
            self._expire_gap(stream, now)
        for entry in self.states.due(now):
            holder = self._streams.get(entry.key)
            if holder is not None and (holder.busy or holder.waiting):
                self.states.touch(entry.key, ttl_s=_SWEEP_S)  # look again at the next sweep
            elif entry.state.ended:
                await self._drop(entry.key)
            else:
                await self._close_stream(entry.key, entry.state, "idle")
        self.metrics.state_keys.labels(self.io.stage).set(len(self.states))

    def _expire_gap(self, stream: _Stream, now: float) -> None:
        if not stream.waiting or stream.busy:
            return
        if now - min(c.arrived for c in stream.waiting.values()) <= self.settings.gap_timeout_s:
            return
        state = self.states.get(stream.handle.key)
        expected = state.next_index if state else 0
        for chunk in stream.waiting.values():
            self._reject(chunk, f"chunk {chunk.index} waited {self.settings.gap_timeout_s:.0f}s for missing chunk {expected}")
        stream.waiting.clear()

    async def _close_stream(self, key: bytes, state: StreamState, reason: str) -> None:
        """No chunk for idle_timeout_s (or evicted): closing results, state marked ended."""
        log.info("%s: stream %r %s: closing", self.io.stage, state.key, reason)
        state.ended = True
        stream = self._streams.get(key)
        records: list[OutRecord] = []
        if stream is not None:
            stream.handle.live_in_triton = False
            if stream.origin is not None:
                records += [self.results.emission(stream.origin, e) for e in self.post.on_close(state, reason)]
        partition = self.states.entry(key).partition  # type: ignore[union-attr]
        records.append(self.states.put(key, state, partition, ttl_s=self.settings.ended_retention_s))
        await self.produce_all_unowned(records)
        self.metrics.idle_closed.labels(self.io.stage).inc()

    async def _drop(self, key: bytes) -> None:
        self._streams.pop(key, None)
        tombstone = self.states.delete(key)
        if tombstone is not None:
            await self.produce_all_unowned([tombstone])

    async def _evict_for(self, key: bytes) -> None:
        """A new stream: evict the idlest ones first when ``max_streams`` are held."""
        for entry in self.states.make_room(key):
            stream = self._streams.get(entry.key)
            if stream is not None and stream.busy:
                continue  # never evict a stream while its chunk is being applied
            if not entry.state.ended:
                await self._close_stream(entry.key, entry.state, "evicted")
            await self._drop(entry.key)
            self.metrics.state_evictions.labels(self.io.stage).inc()

    async def release(self, partitions: list[TopicPartition] | None = None) -> None:
        """Finish the chunks being applied; chunks waiting for a gap are left to be replayed."""
        wanted = None if partitions is None else set(partitions)
        tasks = [
            s.task for s in self._streams.values()
            if s.task is not None and s.busy and (wanted is None or s.partition in wanted)
        ]
        if tasks:
            await asyncio.wait(tasks, timeout=self.io.drain_timeout_s)
