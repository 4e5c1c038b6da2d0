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
through the keyed state store *after* the results of every chunk it covers are
acknowledged (one checkpoint may cover several chunks: ``checkpoints.checkpoint_due``)
and the input offsets are committed after both; a new owner restores the state of its
partitions before consuming them; replayed chunks at or below the checkpoint are
exact duplicates and are dropped, the rest are recomputed from exactly the
checkpointed state.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
from aiokafka.structs import TopicPartition

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.failure_policy import GaveUp
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs, OutRecord
from pipeline.kafka.progress import UpstreamProgress
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.record_trace import record_span
from pipeline.settings import KafkaSettings, TritonSettings
from workers.runtime.event_time import reading_starts
from workers.runtime.stage_io import StageIO
from workers.runtime.stateful import StatefulStage
from workers.runtime.upstream import watched_clock
from workers.sequence.checkpoints import close_pending, complete_chunk
from workers.sequence.chunks import CHUNK_INDEX, Chunk, Placement, parse_chunk, placement
from workers.sequence.model import SequenceModel
from workers.sequence.postprocess import Emission, NoPostProcessing, PostProcessor, VadSegments
from workers.sequence.results import Origin, ResultWriter, gap_emission
from workers.sequence.settings import SequenceSettings
from workers.sequence.state import StreamState, StreamStateCodec, frame
from workers.sequence.streams import SKIP_GAP, Stream, StreamTable

log = logging.getLogger(__name__)

_SWEEP_S = 0.5


class SequenceStage(StatefulStage):
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
            call_timeout_s=settings.call_timeout_s,
            admit=self.fence.admit_call,
        )
        self.idle_timeout_s = settings.idle_timeout_s or 60.0
        self.states = self.keyed_state(
            state_topic, StreamStateCodec(), ttl_s=self.idle_timeout_s, max_keys=settings.max_streams
        )
        progress = UpstreamProgress(kafka, settings.upstream, [io.input_topic], gone_after_s=settings.upstream_gone_after_s)
        self.upstream, self.clock = watched_clock(  # idle only once the stages before are caught up or gone
            progress, self.highwater, stage=io.stage, metrics=metrics, grace_ms=self.idle_timeout_s * 1000, fetched_at=self.fetched_at
        )
        self.max_samples = int(settings.sample_rate * settings.max_chunk_seconds)
        self.post: PostProcessor = NoPostProcessing()
        self.results = ResultWriter(io, model_name=settings.model)
        self.streams = StreamTable(self._drive, io.stage)
        self._last_sweep = time.monotonic()

    # ------------------------------------------------------------------ setup
    async def setup(self) -> None:
        d = await self.model.setup(self.io.stage)
        await self.upstream.start()
        if self.settings.idle_timeout_s is None:
            idle_us = d.sequence_batching.max_sequence_idle_microseconds if d.sequence_batching else 0
            self.idle_timeout_s = self.states.limits.ttl_s = idle_us / 1e6 if idle_us else 60.0
            self.clock.grace_ms = self.idle_timeout_s * 1000
        if self.settings.vad is not None:
            self.post = VadSegments(
                self.settings.vad, frame_size=self.model.frame_size, sample_rate=self.settings.sample_rate
            )
        self.results = ResultWriter(self.io, model_name=d.name, model_version=self.model.version)
        log.info(
            "%s: sequence model %s ready (frames of %d samples at %d Hz, idle %.1fs, gaps: %s)", self.io.stage,
            d.name, self.model.frame_size, self.settings.sample_rate, self.idle_timeout_s, self.settings.gap_policy,
        )

    async def teardown(self) -> None:
        await self.upstream.stop()
        await self.model.close()

    # ------------------------------------------------------------------ ownership
    async def restore(self, partitions: list[TopicPartition]) -> None:
        self.clock.assigned(partitions, await reading_starts(self._consumer, partitions))
        report = await self.restore_states(partitions)
        for stream in self.streams:
            stream.handle.live_in_triton = False
        log.info("%s: restored %d stream states for %s", self.io.stage, report.restored, report.partitions)

    async def forget(self, partitions: list[TopicPartition]) -> None:
        self.streams.cancel(set(partitions))
        numbers = {tp.partition for tp in partitions}
        self.states.forget(numbers)
        self.clock.forget(numbers)

    # ------------------------------------------------------------------ per record
    async def handle(self, record: ConsumedRecord, slot: Slot[Outputs]) -> None:
        try:
            chunk = parse_chunk(record, slot, self.settings.input_tensor, self.max_samples)
        except BadRequest as bad:
            self.dead_letter(record, slot, bad.error_class, bad.reason)
            return
        key = record.key or b""
        stream = self.streams.get(key)
        if stream is None:
            await self._evict_for(key)
            stream = self.streams.open(key, TopicPartition(record.topic, record.partition))
        self.states.touch(key)  # activity: the idle clock restarts
        stream.origin = Origin.of(chunk)
        self.streams.enqueue(stream, chunk)

    async def _drive(self, stream: Stream) -> None:
        """Apply the stream's chunks (and gap skips) in order until its queue is empty."""
        while not stream.queue.empty():
            item = stream.queue.get_nowait()
            if item is SKIP_GAP:
                if stream.waiting:
                    await self._skip_gap(stream)
            else:
                await self._place(stream, item)
        close_pending(self.outbox, self.states, stream.pending, stream.handle.key)

    async def _place(self, stream: Stream, chunk: Chunk) -> None:
        key = stream.handle.key
        where, reason = placement(self.states.get(key), chunk, stream.waiting, self.settings.reorder_window)
        if where is Placement.OVERFLOW and self.settings.gap_policy == "skip":
            stream.waiting[chunk.index] = chunk  # the window is full: what is missing is lost
            while (state := self.states.get(key)) is None or chunk.index - state.next_index > self.settings.reorder_window:
                await self._skip_gap(stream)
        elif where in (Placement.REJECT, Placement.OVERFLOW):
            self._reject(chunk, reason)
        elif where is Placement.DUPLICATE:
            self.metrics.records_dropped.labels(self.io.stage, reason).inc()
            self.outbox.complete(chunk.slot, ())  # nothing to do: applied (or waiting) already
        elif where is Placement.WAIT:
            stream.waiting[chunk.index] = chunk  # wait for the gap to fill
        else:
            if where is Placement.RESTART:
                self.states.delete(key)  # the key's next stream; its checkpoint replaces the old one
                stream.handle.live_in_triton = False
            await self._apply(stream, chunk)
            await self._apply_waiting(stream)

    async def _apply_waiting(self, stream: Stream) -> None:
        while (state := self.states.get(stream.handle.key)) is not None and state.next_index in stream.waiting:
            await self._apply(stream, stream.waiting.pop(state.next_index))

    async def _skip_gap(self, stream: Stream) -> None:
        """Give up on the chunks missing before the first waiting one: the stream goes on,
        and the next result carries a ``gap`` result naming them."""
        key, first = stream.handle.key, min(stream.waiting)
        state = self.states.get(key) or StreamState(key=key.decode("utf-8", "replace"))
        stream.gaps.append((state.next_index, first))
        self.metrics.stream_gaps.labels(self.io.stage).inc(first - state.next_index)
        state.skip(state.next_index, first)
        self.states.put(key, state, stream.partition.partition)  # checkpointed with the next chunk
        await self._apply_waiting(stream)

    def _reject(self, chunk: Chunk, reason: str) -> None:
        self.dead_letter(chunk.record, chunk.slot, ErrorClass.MALFORMED_REQUEST, reason)

    async def _apply(self, stream: Stream, chunk: Chunk) -> None:
        key, partition = stream.handle.key, chunk.record.partition
        state = self.states.get(key) or StreamState(key=key.decode("utf-8", "replace"))
        work = state.copy()  # kept only when the whole chunk succeeds
        frames, work.carry = frame(work.carry, chunk.samples, self.model.frame_size)
        ending = chunk.request.sequence_end
        if ending and (work.carry.size or not frames):
            frames.append(np.pad(work.carry, (0, self.model.frame_size - work.carry.size)))  # last, zero-padded
            work.carry = np.zeros(0, np.float32)
        try:
            outputs = await self.model.infer_frames(
                stream.handle, work, frames, ending=ending, on_retry=self.outcomes.retried, traced=record_span(chunk.slot)
            )
        except GaveUp as gave_up:
            state.remember(chunk.index, chunk.payload)
            state.next_index += 1  # the stream goes on without this chunk; it is dead-lettered
            self.states.put(key, state, partition)
            self.dead_letter(chunk.record, chunk.slot, gave_up.failure.error_class, gave_up.failure.reason)
            return
        work.samples_in += chunk.samples.size
        work.next_index = chunk.index + 1
        work.remember(chunk.index, chunk.payload)
        work.last_ms = self.clock.timestamp(chunk.record)
        origin = Origin.of(chunk)
        emissions = [gap_emission(start, stop) for start, stop in stream.gaps]
        stream.gaps = []
        emissions.append(Emission("chunk", self.model.frame_tensors(work, outputs), {CHUNK_INDEX: chunk.index}))
        emissions += self.post.on_frames(work, outputs, chunk_index=chunk.index, ending=ending)
        work.ended = ending
        ttl = self.settings.ended_retention_s if ending else None
        records = [self.results.emission(origin, e) for e in emissions]
        self.states.keep(key, work, partition, ttl_s=ttl)
        more = not stream.queue.empty()  # another chunk of the stream follows: its checkpoint may wait
        complete_chunk(self.outbox, self.states, self.settings.checkpoint, stream.pending, chunk.slot, records, key, ending=ending, more_on_hand=more)

    # ------------------------------------------------------------------ time
    async def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < _SWEEP_S:
            return
        self._last_sweep = now
        self.clock.watch(self._owned)
        if self.settings.upstream and len(self.states):
            self.upstream.poll(self._consumer, self._owned)
        for stream in self.streams:
            await check_gap(self, stream, now)
        for entry in self.states.due(now):
            holder = self.streams.get(entry.key)
            if holder is not None and (holder.busy or holder.waiting):
                self.states.touch(entry.key, ttl_s=_SWEEP_S)  # look again at the next sweep
            elif entry.state.ended:
                await self._drop(entry.key)
            elif (quiet := self._quiet_s(entry.state.last_ms, entry.partition)) < self.idle_timeout_s:
                self.states.touch(entry.key, ttl_s=self.idle_timeout_s - quiet)  # not idle in event time
            else:
                await self._close_stream(entry.key, entry.state, "idle")
        self.metrics.state_keys.labels(self.io.stage).set(len(self.states))

    def _quiet_s(self, last_ms: int, partition: int) -> float:
        """Event time since a stream's last chunk (a partition with a backlog does not age it)."""
        return self.clock.since_s(last_ms, [TopicPartition(self.io.input_topic, partition)])

    async def _close_stream(self, key: bytes, state: StreamState, reason: str) -> None:
        """Closed without an end chunk (idle, evicted, failed by a gap): closing results,
        state marked ended (so later chunks are dead-lettered, not silently started)."""
        log.info("%s: stream %r %s: closing", self.io.stage, state.key, reason)
        state.ended = True
        stream = self.streams.get(key)
        records: list[OutRecord] = []
        if stream is not None:
            stream.handle.live_in_triton = False
            if stream.origin is not None:
                records += [self.results.emission(stream.origin, e) for e in self.post.on_close(state, reason)]
        entry = self.states.entry(key)
        assert entry is not None, "only streams with state are closed"
        records.append(self.states.put(key, state, entry.partition, ttl_s=self.settings.ended_retention_s))
        await self.produce_all_unowned(records, entry.partition)
        self.metrics.streams_closed.labels(self.io.stage, reason).inc()

    async def _drop(self, key: bytes) -> None:
        self.streams.pop(key)
        entry = self.states.entry(key)
        tombstone = self.states.delete(key)
        if tombstone is not None and entry is not None:
            await self.produce_all_unowned([tombstone], entry.partition)

    async def _evict_for(self, key: bytes) -> None:
        """A new stream: evict the idlest ones first when ``max_streams`` are held."""
        for entry in self.states.make_room(key):
            stream = self.streams.get(entry.key)
            if stream is not None and stream.busy:
                continue  # never evict a stream while its chunk is being applied
            if not entry.state.ended:
                await self._close_stream(entry.key, entry.state, "evicted")
            await self._drop(entry.key)
            self.metrics.state_evictions.labels(self.io.stage).inc()

    async def release(self, partitions: list[TopicPartition] | None = None) -> None:
        """Finish the chunks being applied; chunks waiting for a gap are left to be replayed."""
        tasks = self.streams.running(None if partitions is None else set(partitions))
        if tasks:
            await asyncio.wait(tasks, timeout=self.io.drain_timeout_s)


async def check_gap(stage: SequenceStage, stream: Stream, now: float) -> None:
    """Apply the gap policy to a stream whose first waiting chunk has waited ``gap_timeout_s``
    (a function of the stage, kept outside the class to keep it readable)."""
    settings = stage.settings
    if not stream.waiting or stream.busy or now - min(c.arrived for c in stream.waiting.values()) <= settings.gap_timeout_s:
        return
    if settings.gap_policy == "skip":
        stage.streams.enqueue(stream, SKIP_GAP)
        return
    state = stage.states.get(stream.handle.key)
    expected = state.next_index if state else 0
    for chunk in stream.waiting.values():
        stage._reject(chunk, f"chunk {chunk.index} waited {settings.gap_timeout_s:.0f}s for missing chunk {expected}")
    stream.waiting.clear()
    if state is not None:
        await stage._close_stream(stream.handle.key, state, "gap")
