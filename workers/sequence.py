"""The sequence stage: stateful streams pinned by key, driven through Triton's sequence batcher.

Affinity: the Kafka key is the stream key, so every chunk of a stream lands in
one partition and therefore at one worker; the stream maps to one Triton
``sequence_id`` (a hash of the key), so Triton routes it to one sequence slot.

Per stream, chunks are applied strictly in ``chunk_index`` order: a chunk that
arrives early waits (up to ``reorder_window`` chunks, ``gap_timeout_s``); an
exact duplicate of an applied chunk is dropped; a conflicting duplicate, a
chunk too far ahead, or one after the stream ended is dead-lettered. A chunk is
never applied twice, across crashes too, because the digests of applied chunks
are part of the checkpoint.

Crash consistency (argued in docs/streaming.md): after each chunk the stream's
state (next index, carried samples, the model's recurrent state outputs,
segment tracker) is written to a compacted changelog topic *after* the chunk's
results are acknowledged, and the input offset is committed after both. A new
owner restores the state of its partitions before consuming them; replayed
chunks at or below the checkpoint are exact duplicates and are dropped, the
rest are recomputed from exactly the checkpointed state. Triton's own copy of
the state is an optimisation: whenever it may be gone (a new worker, a Triton
restart, any failed call) the sequence is restarted with START and the
checkpointed state as the model's state inputs.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc.aio as triton_aio
from aiokafka.structs import TopicPartition
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException

from pipeline.contract import headers as h
from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.request import InferenceRequest, decode_request
from pipeline.contract.response import encode_response
from pipeline.contract.records import result_headers
from pipeline.errors import ConfigError
from pipeline.kafka.changelog import read_changelog
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import OutRecord, Outputs
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings, TritonSettings
from pipeline.topology.model import SequenceStage as SequenceConfig
from pipeline.triton.admin import ModelDescription, TritonAdmin
from workers.base import Record, StageIO, StreamStage
from workers.sequence_state import (
    SegmentTracker,
    StreamState,
    decode_checkpoint,
    encode_checkpoint,
    frame,
)
from workers.stateless import FailureKind, RetryPolicy
from workers.triton_backend import TritonModelBackend

log = logging.getLogger(__name__)

CHUNK_INDEX = "chunk_index"
RESULT_TYPE = "result-type"


@dataclass(eq=False)
class _Chunk:
    record: Record
    slot: Slot[Outputs]
    request: InferenceRequest
    index: int
    samples: np.ndarray
    arrived: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Origin:
    """What a result answers: the record key, the decoded request (for its wire form), headers."""

    key: bytes
    request: InferenceRequest
    headers: list[tuple[str, bytes]]
    timestamp: int

    @classmethod
    def of(cls, chunk: _Chunk) -> _Origin:
        r = chunk.record
        return cls(r.key or b"", chunk.request, list(r.headers or ()), r.timestamp)


@dataclass
class _Stream:
    """In-memory side of a stream: its queue of chunks and its worker task."""

    key: str
    partition: TopicPartition
    queue: asyncio.Queue[_Chunk] = field(default_factory=asyncio.Queue)
    waiting: dict[int, _Chunk] = field(default_factory=dict)  # arrived early, by index
    task: asyncio.Task[None] | None = None
    live_in_triton: bool = False  # Triton holds this stream's state right now
    origin: _Origin | None = None  # the latest chunk's key/request/headers, for an idle summary
    last_activity: float = field(default_factory=time.monotonic)
    ended_at: float | None = None


class SequenceStage(StreamStage):
    """Stateful streams through a Triton sequence model, with Kafka-backed state."""

    def __init__(
        self,
        io: StageIO,
        config: SequenceConfig,
        *,
        state_topic: str,
        kafka: KafkaSettings,
        triton: TritonSettings,
        metrics: PipelineMetrics,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(io, kafka, metrics)
        self.config = config
        self.state_topic = state_topic
        self.triton_settings = triton
        self.retry = retry or RetryPolicy()
        self.description: ModelDescription | None = None
        self.frame_size = 0
        self.model_input = ""
        self.idle_timeout_s = config.idle_timeout_s or 60.0
        self._client: triton_aio.InferenceServerClient | None = None
        self._backend: TritonModelBackend | None = None  # for failure classification only
        self._states: dict[str, StreamState] = {}
        self._streams: dict[str, _Stream] = {}
        self._slots = asyncio.Semaphore(config.max_inflight_requests)
        self._last_sweep = time.monotonic()

    # ------------------------------------------------------------------ setup
    async def setup(self) -> None:
        with TritonAdmin(self.triton_settings) as admin:
            await asyncio.to_thread(admin.wait_ready, 120.0)
            self.description = await asyncio.to_thread(
                admin.describe, self.config.model, self.config.model_version
            )
        d = self.description
        if d.sequence_batching is None:
            raise ConfigError(f"stage {self.io.stage}: model {d.name!r} has no sequence_batching")
        required = [s for s in d.inputs if not s.optional]
        name = self.config.model_input or (required[0].name if required else "")
        spec = d.input(name)
        if len(spec.shape) != 1 or spec.shape[0] <= 0:
            raise ConfigError(f"stage {self.io.stage}: input {name!r} must be a fixed 1-D window, is {spec.shape}")
        self.model_input, self.frame_size = name, spec.shape[0]
        for state_input, state_output in self.config.state_map.items():
            d.input(state_input)
            d.output(state_output)
        if self.config.idle_timeout_s is None:
            idle_us = d.sequence_batching.max_sequence_idle_microseconds
            self.idle_timeout_s = idle_us / 1e6 if idle_us else 60.0
        assert self.triton_settings.grpc_url
        self._client = triton_aio.InferenceServerClient(self.triton_settings.grpc_url)
        self._backend = TritonModelBackend(self.triton_settings, self.config.model, self.config.model_version)
        self._backend._client = self._client  # noqa: SLF001 - shares the channel for readiness checks
        log.info(
            "%s: sequence model %s ready (frames of %d samples, idle %.1fs, state %s)",
            self.io.stage, d.name, self.frame_size, self.idle_timeout_s, self.config.state_map or "in Triton only",
        )

    async def teardown(self) -> None:
        if self._client is not None:
            await self._client.close()

    # ------------------------------------------------------------------ state restore
    async def restore(self, partitions: list[TopicPartition]) -> None:
        """Load the checkpoints of the streams in ``partitions`` (same partition numbers)."""
        states = await read_changelog(self.kafka, self.state_topic, [tp.partition for tp in partitions])
        for key, value in states.items():
            self._states[key.decode()] = decode_checkpoint(value)
        for stream in self._streams.values():
            stream.live_in_triton = False
        log.info("%s: restored %d stream states for %s", self.io.stage, len(states), [str(t) for t in partitions])

    async def forget(self, partitions: list[TopicPartition]) -> None:
        gone = {tp for tp in partitions}
        for key, stream in list(self._streams.items()):
            if stream.partition in gone:
                if stream.task is not None:
                    stream.task.cancel()
                self._streams.pop(key, None)
                self._states.pop(key, None)

    # ------------------------------------------------------------------ per record
    async def handle(self, record: Record, slot: Slot[Outputs]) -> None:
        try:
            chunk = self._parse(record, slot)
        except BadRequest as bad:
            self.dead_letter(record, slot, bad.error_class, bad.reason)
            return
        key = self._key(record)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream(key, TopicPartition(record.topic, record.partition))
        stream.last_activity = time.monotonic()
        stream.origin = _Origin.of(chunk)
        stream.queue.put_nowait(chunk)
        if stream.task is None or stream.task.done():
            stream.task = asyncio.create_task(self._drive(stream), name=f"{self.io.stage}-{stream.key}")

    @staticmethod
    def _key(record: Record) -> str:
        return record.key.decode("utf-8", errors="replace") if record.key else ""

    def _parse(self, record: Record, slot: Slot[Outputs]) -> _Chunk:
        if not record.key:
            raise BadRequest(ErrorClass.MALFORMED_REQUEST, "a stream chunk needs the stream key as the record key")
        request = decode_request(record.value, list(record.headers or ()))
        raw_index = request.parameters.get(CHUNK_INDEX, h.get_header(list(record.headers or ()), "chunk-index"))
        try:
            index = int(raw_index)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"missing or invalid {CHUNK_INDEX!r} parameter") from None
        if index < 0 or isinstance(raw_index, bool):
            raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"{CHUNK_INDEX} must be a non-negative integer")
        tensor = request.inputs.get(self.config.input_tensor)
        if tensor is None:
            raise BadRequest(ErrorClass.MISSING_INPUT, f"chunk has no {self.config.input_tensor!r} tensor")
        if request.datatypes[self.config.input_tensor] not in ("FP32", "FP16", "FP64"):
            raise BadRequest(ErrorClass.DATATYPE_MISMATCH, f"{self.config.input_tensor!r} must be floating point samples")
        samples = np.asarray(tensor, dtype=np.float32)
        if samples.ndim == 2 and samples.shape[0] == 1:
            samples = samples[0]
        if samples.ndim != 1:
            raise BadRequest(ErrorClass.SHAPE_MISMATCH, f"samples must be [n] or [1, n], got {list(tensor.shape)}")
        return _Chunk(record, slot, request, index, samples)

    # ------------------------------------------------------------------ one stream
    async def _drive(self, stream: _Stream) -> None:
        """Apply the stream's chunks in index order until its queue is empty."""
        while not stream.queue.empty():
            chunk = stream.queue.get_nowait()
            await self._place(stream, chunk)

    async def _place(self, stream: _Stream, chunk: _Chunk) -> None:
        state = self._states.get(stream.key)
        expected = state.next_index if state is not None else 0
        payload = chunk.record.value or b""
        if chunk.index < expected:
            assert state is not None
            same = state.is_exact_duplicate(chunk.index, payload)
            if same is False:
                self._reject(chunk, f"chunk {chunk.index} conflicts with the chunk already applied at that index")
            else:
                self.metrics.duplicates_dropped.labels(self.io.stage).inc()
                self.outbox.complete(chunk.slot, ())  # exact duplicate (or too old to differ): nothing to do
            return
        if state is not None and state.ended:
            self._reject(chunk, f"stream {stream.key!r} already ended at chunk {state.next_index - 1}")
            return
        if chunk.index > expected:
            if chunk.index - expected > self.config.reorder_window or chunk.index in stream.waiting:
                self._reject(chunk, f"chunk {chunk.index} cannot be placed: expected {expected}")
            else:
                stream.waiting[chunk.index] = chunk  # wait for the gap to fill
            return
        await self._apply(stream, chunk)
        while (state := self._states.get(stream.key)) is not None and state.next_index in stream.waiting:
            await self._apply(stream, stream.waiting.pop(state.next_index))

    def _reject(self, chunk: _Chunk, reason: str) -> None:
        self.dead_letter(chunk.record, chunk.slot, ErrorClass.MALFORMED_REQUEST, reason)

    async def _apply(self, stream: _Stream, chunk: _Chunk) -> None:
        state = self._states.get(stream.key)
        if state is None:
            if not chunk.request.sequence_start or chunk.index != 0:
                self._reject(chunk, f"unknown stream {stream.key!r}: its first chunk must be chunk 0 with sequence_start")
                return
            state = StreamState(key=stream.key)
        work = state.copy()  # applied only when the whole chunk succeeds
        frames, work.carry = frame(work.carry, chunk.samples, self.frame_size)
        ending = chunk.request.sequence_end
        if ending and (work.carry.size or not frames):
            frames.append(np.pad(work.carry, (0, self.frame_size - work.carry.size)))  # last, zero-padded
            work.carry = np.zeros(0, np.float32)
        try:
            outputs = await self._infer_frames(stream, work, frames, ending)
        except _ChunkFailed as failed:
            stream.live_in_triton = False
            state.remember(chunk.index, chunk.record.value or b"")
            state.next_index += 1  # the stream goes on without this chunk; it is dead-lettered
            self.dead_letter(chunk.record, chunk.slot, failed.error_class, failed.reason)
            self._states[stream.key] = state
            return
        work.samples_in += chunk.samples.size
        work.next_index = chunk.index + 1
        work.remember(chunk.index, chunk.record.value or b"")
        records = self._results(chunk, work, outputs, ending)
        work.ended = ending
        if ending:
            stream.ended_at = time.monotonic()
            stream.live_in_triton = False
        self._states[stream.key] = work
        records.append(self._checkpoint(chunk.record.partition, work))
        self.outbox.complete(chunk.slot, tuple(records))

    # ------------------------------------------------------------------ Triton
    async def _infer_frames(
        self, stream: _Stream, work: StreamState, frames: list[np.ndarray], ending: bool
    ) -> list[dict[str, np.ndarray]]:
        results = []
        for i, window in enumerate(frames):
            last = ending and i == len(frames) - 1
            results.append(await self._infer_one(stream, work, window, end=last))
            work.frames_done += 1
        return results

    async def _infer_one(self, stream: _Stream, work: StreamState, window: np.ndarray, *, end: bool) -> dict[str, np.ndarray]:
        assert self._client is not None and self.description is not None and self._backend is not None
        attempt = outage = 0
        while True:
            start = not stream.live_in_triton
            inputs = [_tensor(self.model_input, window)]
            if start and work.frames_done > 0:
                # Resume: Triton does not hold this stream; hand it the checkpointed state.
                for state_input, state_output in self.config.state_map.items():
                    inputs.append(_tensor(state_input, work.model_state[state_output]))
            try:
                async with self._slots:
                    response = await self._client.infer(
                        self.config.model,
                        inputs,
                        model_version=self.config.model_version,
                        outputs=[InferRequestedOutput(o.name) for o in self.description.outputs],
                        sequence_id=sequence_id(stream.key),
                        sequence_start=start,
                        sequence_end=end,
                    )
            except InferenceServerException as exc:
                stream.live_in_triton = False  # whatever happened, resume with explicit state
                failure = await self._backend.classify(exc)
                if failure.kind is FailureKind.OUTAGE:
                    outage += 1
                    self.metrics.triton_retries.labels(self.io.stage).inc()
                    await asyncio.sleep(self.retry.backoff(min(outage, 10)))
                    continue
                attempt += 1
                if attempt >= self.retry.max_attempts:
                    raise _ChunkFailed(failure.error_class, f"gave up after {attempt} attempts: {failure.reason}") from exc
                self.metrics.triton_retries.labels(self.io.stage).inc()
                await asyncio.sleep(self.retry.backoff(attempt))
                continue
            stream.live_in_triton = not end
            outputs = {o.name: response.as_numpy(o.name)[0] for o in self.description.outputs}
            for state_output in self.config.state_map.values():
                work.model_state[state_output] = np.asarray(outputs[state_output], dtype=np.float32)
            return outputs

    # ------------------------------------------------------------------ outputs
    def _results(
        self, chunk: _Chunk, work: StreamState, outputs: list[dict[str, np.ndarray]], ending: bool
    ) -> list[OutRecord]:
        first_frame = work.frames_done - len(outputs)
        stateful = set(self.config.state_map.values())
        names = [o.name for o in self.description.outputs if o.name not in stateful] if self.description else []
        tensors = {
            name: np.stack([np.asarray(o[name]) for o in outputs]) if outputs else np.zeros((0,), np.float32)
            for name in names
        }
        tensors["frame_index"] = np.arange(first_frame, work.frames_done, dtype=np.int64)
        origin = _Origin.of(chunk)
        params = {CHUNK_INDEX: chunk.index}
        records = [self._result(origin, tensors, params, "chunk")]
        seg = self.config.segments
        if seg is not None:
            frame_s = self.frame_size / self._sample_rate()
            tracker = SegmentTracker(
                threshold=seg.threshold,
                neg_threshold=seg.neg_threshold,
                min_speech_frames=round(seg.min_speech_ms / 1000 / frame_s),
                min_silence_frames=round(seg.min_silence_ms / 1000 / frame_s),
            )
            if work.tracker:
                tracker.restore(work.tracker)
            closed = []
            for offset, output in enumerate(outputs):
                probability = float(np.asarray(output[seg.output]).reshape(-1)[0])
                if probability >= seg.threshold:
                    work.speech_frames += 1
                segment = tracker.push(first_frame + offset, probability)
                if segment:
                    closed.append(segment)
            if ending and (segment := tracker.finish(work.frames_done)):
                closed.append(segment)
            work.tracker = tracker.to_dict()
            for segment in closed:
                work.segments += 1
                records.append(
                    self._result(
                        origin,
                        {
                            "start_s": np.array([segment.start_frame * frame_s]),
                            "end_s": np.array([segment.end_frame * frame_s]),
                        },
                        {CHUNK_INDEX: chunk.index, "segment_index": work.segments - 1},
                        "segment",
                    )
                )
            if ending:
                records.append(self._summary(origin, work, "end"))
        return records

    def _summary(self, origin: _Origin, work: StreamState, reason: str) -> OutRecord:
        frame_s = self.frame_size / self._sample_rate()
        tensors = {
            "duration_s": np.array([work.samples_in / self._sample_rate()]),
            "speech_s": np.array([work.speech_frames * frame_s]),
            "segments": np.array([work.segments], dtype=np.int64),
            "chunks": np.array([work.next_index], dtype=np.int64),
        }
        return self._result(origin, tensors, {CHUNK_INDEX: work.next_index - 1, "reason": reason}, "summary")

    def _sample_rate(self) -> int:
        return 16000

    def _result(
        self, origin: _Origin, tensors: dict[str, np.ndarray], params: dict[str, object], kind: str
    ) -> OutRecord:
        model = self.description.name if self.description else self.config.model
        version = str(max(self.description.versions)) if self.description and self.description.versions else ""
        value, content_type = encode_response(
            origin.request, tensors, model_name=model, model_version=version, parameters=params  # type: ignore[arg-type]
        )
        headers = result_headers(
            origin.headers,
            correlation_id=origin.request.correlation_id,
            stage=self.io.stage,
            model_name=model,
            model_version=version,
            content_type=content_type,
        ) + [(RESULT_TYPE, kind.encode())]
        return OutRecord(
            topic=self.io.output_topic,
            key=origin.key,
            value=value,
            headers=headers,
            request_timestamp_ms=origin.timestamp or None,
        )

    def _checkpoint(self, partition: int, state: StreamState) -> OutRecord:
        return self.state_record(self.state_topic, state.key.encode(), encode_checkpoint(state), partition)

    # ------------------------------------------------------------------ time
    def next_tick_s(self) -> float:
        return 0.05

    async def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < 0.5:
            return
        self._last_sweep = now
        for stream in list(self._streams.values()):
            busy = stream.task is not None and not stream.task.done()
            if stream.waiting and not busy:
                oldest = min(c.arrived for c in stream.waiting.values())
                if now - oldest > self.config.gap_timeout_s:
                    state = self._states.get(stream.key)
                    expected = state.next_index if state else 0
                    for chunk in stream.waiting.values():
                        self._reject(chunk, f"chunk {chunk.index} waited {self.config.gap_timeout_s:.0f}s for missing chunk {expected}")
                    stream.waiting.clear()
            state = self._states.get(stream.key)
            if busy or stream.waiting or state is None:
                continue
            if state.ended and stream.ended_at and now - stream.ended_at > self.config.ended_retention_s:
                await self.produce_unowned(
                    self.state_record(self.state_topic, state.key.encode(), None, stream.partition.partition)
                )
                self._streams.pop(stream.key, None)
                self._states.pop(stream.key, None)
            elif not state.ended and now - stream.last_activity > self.idle_timeout_s:
                await self._close_idle(stream, state)

    async def _close_idle(self, stream: _Stream, state: StreamState) -> None:
        """No chunk for idle_timeout_s: final summary (reason "idle"), state marked ended."""
        log.info("%s: stream %s idle for %.1fs: closing", self.io.stage, stream.key, self.idle_timeout_s)
        state.ended = True
        stream.ended_at = time.monotonic()
        stream.live_in_triton = False
        records: list[OutRecord] = []
        if self.config.segments is not None and stream.origin is not None:
            records.append(self._summary(stream.origin, state, "idle"))
        records.append(self._checkpoint(stream.partition.partition, state))
        for out in records:
            await self.produce_unowned(out)
        self.metrics.idle_closed.labels(self.io.stage).inc()

    async def release(self, partitions: list[TopicPartition] | None = None) -> None:
        """Finish the chunks being applied; chunks waiting for a gap are left to be replayed."""
        wanted = None if partitions is None else set(partitions)
        tasks = [
            s.task for s in self._streams.values()
            if s.task is not None and not s.task.done() and (wanted is None or s.partition in wanted)
        ]
        if tasks:
            await asyncio.wait(tasks, timeout=self.io.drain_timeout_s)


class _ChunkFailed(Exception):
    def __init__(self, error_class: ErrorClass, reason: str) -> None:
        super().__init__(reason)
        self.error_class = error_class
        self.reason = reason


def sequence_id(key: str) -> int:
    """A stable, non-zero 63-bit Triton correlation ID for a stream key."""
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return (digest & ((1 << 63) - 1)) or 1


def _tensor(name: str, array: np.ndarray) -> InferInput:
    data = np.asarray(array, dtype=np.float32)[None, ...]
    tensor = InferInput(name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor

