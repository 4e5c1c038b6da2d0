"""A sequence model on Triton: one call per frame, routed by ``sequence_id``.

Triton's sequence batcher keeps a stream's state between calls that carry the
same ``sequence_id``; ``sequence_start`` / ``sequence_end`` open and close it.
Triton's copy of that state is only an optimisation: whenever it may be gone
(a new worker, a Triton restart, any failed call) the stream is restarted with
START and the checkpointed state outputs handed back as the model's state
inputs (``state_map``: state input -> the output that feeds it).

Failures go through the shared policy (:func:`pipeline.failure_policy.call_with_retry`)
with the shared Triton classifier, like a batching stage's.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc.aio as triton_aio
from opentelemetry.trace import Span
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException

from pipeline.contract.errors import ErrorClass
from pipeline.errors import ConfigError
from pipeline.failure_policy import Failure, FailureKind, RetryPolicy, call_with_retry
from pipeline.observability.tracing import call_span, grpc_metadata
from pipeline.settings import TritonSettings
from pipeline.triton.admin import ModelDescription, TritonAdmin
from pipeline.triton.client import aio_client, triton_call_span
from pipeline.triton.failures import TritonFailureClassifier
from pipeline.triton.replica_set import NoReplicaUp, Replica, ReplicaSet
from pipeline.triton.replicas import replica_settings, replica_spec
from workers.sequence.state import StreamState

log = logging.getLogger(__name__)


@dataclass
class StreamHandle:
    """What the model needs to know of one stream between calls."""

    key: bytes
    live_in_triton: bool = False  # Triton holds this stream's state right now
    replica: str | None = None  # the Triton replica its calls go to (it holds the state)
    sequence_id: int = 0  # its Triton correlation ID for this worker (0: not computed yet)


class SequenceChannel:
    """One Triton replica of a sequence model: its gRPC channel and failure classifier."""

    def __init__(self, settings: TritonSettings, model: str, model_version: str, probe_timeout_s: float) -> None:
        self.settings, self.model, self.model_version = settings, model, model_version
        self.probe_timeout_s = probe_timeout_s
        self.client: triton_aio.InferenceServerClient | None = None
        self.classifier: TritonFailureClassifier | None = None

    async def setup(self) -> ModelDescription:
        """Wait until the server is ready; open the channel; the model's description."""
        with TritonAdmin(self.settings) as admin:
            await asyncio.to_thread(admin.wait_ready, 120.0)
            description = await asyncio.to_thread(admin.describe, self.model, self.model_version)
        self.client = aio_client(self.settings)
        self.classifier = TritonFailureClassifier(
            self.client, self.model, self.model_version, probe_timeout_s=self.probe_timeout_s
        )
        return description

    async def ready(self) -> bool:
        """Server and model ready (probed while this replica is out)."""
        return self.classifier is not None and await self.classifier.serving()

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


class SequenceCallFailed(Exception):
    """A frame's call on one replica failed: carries the replica, whose classifier judges the cause."""

    def __init__(self, replica: Replica[SequenceChannel], cause: Exception) -> None:
        super().__init__(f"Triton replica {replica.endpoint}: {cause}")
        self.replica, self.cause = replica, cause


class SequenceModel:
    """Frames in, per-frame outputs out, for one Triton model with sequence batching."""

    def __init__(
        self,
        settings: TritonSettings,
        model: str,
        model_version: str = "",
        *,
        model_input: str | None = None,
        state_map: Mapping[str, str] | None = None,
        max_inflight: int = 64,
        retry: RetryPolicy | None = None,
        call_timeout_s: float = 30.0,
        admit: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        self.admit = admit
        """Awaited before every call (the stage's membership fence): Triton keeps a stream's
        state by sequence id for whichever worker calls, so a frozen worker's late frame would
        corrupt the stream its partition's new owner now drives."""
        self.model = model
        self.model_version = model_version
        self.requested_input = model_input
        self.state_map = dict(state_map or {})
        self.retry = retry or RetryPolicy()
        self.call_timeout_s = call_timeout_s
        """Client deadline of one frame's call: a hung Triton times out and is classified an outage."""
        self.description: ModelDescription | None = None
        self._outputs: list[str] = []
        self._requested: list[InferRequestedOutput] = []
        self.model_input = ""
        self.frame_size = 0
        self.replicas: ReplicaSet[SequenceChannel] = ReplicaSet(
            replica_spec(settings.grpc_url or ""),
            lambda endpoint: SequenceChannel(replica_settings(settings, endpoint), model, model_version, min(2.0, call_timeout_s)),
            lambda channel: channel.setup(),
            label=f"model {model}",
        )
        """Triton's replicas; each stream's calls go to one, by key (:meth:`ReplicaSet.by_key`)."""
        self._slots = asyncio.Semaphore(max_inflight)
        self.owner = secrets.token_bytes(8)
        """Salts this worker's sequence ids (:func:`sequence_id`): a stream that moves to
        another worker gets another Triton sequence, so a frame a frozen former owner had
        already admitted (its fence checked, then the process stopped before the call left)
        lands in a sequence nobody drives any more, never in the new owner's."""
        self._call_span = triton_call_span(settings, model, model_version)

    async def _classify(self, exc: BaseException) -> Failure:
        if isinstance(exc, NoReplicaUp):
            return Failure(FailureKind.OUTAGE, ErrorClass.MODEL_UNAVAILABLE, str(exc))
        replica, cause = (exc.replica, exc.cause) if isinstance(exc, SequenceCallFailed) else (self.replicas.first, exc)
        if _forgot_sequence(cause):
            # The stream is already marked not live: the retry sends START with the checkpointed
            # state, exactly as after a worker restart (docs/streaming.md).
            reason = "Triton no longer holds the sequence; resumed with START and the checkpointed state"
            return Failure(FailureKind.TRANSIENT, ErrorClass.INFERENCE_FAILED, reason)
        assert replica is not None and replica.member.classifier is not None
        # A replica's outage moves its streams to another while one is up (ReplicaSet.failed).
        return self.replicas.failed(replica, await replica.member.classifier.classify(cause))

    async def setup(self, label: str) -> ModelDescription:
        """Reach Triton (the first replica that answers), describe the model and check it can
        serve streams; returns its description."""
        first = await self.replicas.start()
        d = first.setup_result
        assert isinstance(d, ModelDescription)
        self._call_span = triton_call_span(first.member.settings, self.model, self.model_version)
        if d.sequence_batching is None:
            raise ConfigError(f"stage {label}: model {d.name!r} has no sequence_batching")
        required = [s for s in d.inputs if not s.optional]
        name = self.requested_input or (required[0].name if required else "")
        spec = d.input(name)
        if len(spec.shape) != 1 or spec.shape[0] <= 0:
            raise ConfigError(f"stage {label}: input {name!r} must be a fixed 1-D window, is {spec.shape}")
        for state_input, state_output in self.state_map.items():
            d.input(state_input)
            d.output(state_output)
        self.description, self.model_input, self.frame_size = d, name, spec.shape[0]
        self._outputs = [o.name for o in d.outputs]
        self._requested = [InferRequestedOutput(o) for o in self._outputs]  # the same every frame: built once
        return d

    async def close(self) -> None:
        await self.replicas.close()

    @property
    def result_outputs(self) -> list[str]:
        """Outputs reported per frame (state outputs are checkpointed, not reported)."""
        stateful = set(self.state_map.values())
        return [o.name for o in self.description.outputs if o.name not in stateful] if self.description else []

    @property
    def version(self) -> str:
        d = self.description
        return str(max(d.versions)) if d is not None and d.versions else ""

    async def infer(
        self,
        stream: StreamHandle,
        window: np.ndarray,
        *,
        resume_state: Mapping[str, np.ndarray],
        resuming: bool,
        end: bool,
        on_retry: Callable[[Failure], None] | None = None,
        traced: Span | None = None,
    ) -> dict[str, np.ndarray]:
        """One frame. ``resume_state`` (state output name -> array) is sent as the model's
        state inputs when Triton does not hold the stream and ``resuming`` is true
        (the stream has frames before this one). With tracing on, each call is a span,
        child of ``traced`` (the chunk's span). Raises :class:`GaveUp`."""
        assert self.description is not None
        outputs, names = self._requested, self._outputs

        async def attempt() -> dict[str, np.ndarray]:
            if self.admit is not None:
                await self.admit()
            replica = self.replicas.by_key(stream.key)
            if stream.replica != replica.endpoint:  # a new stream, or its replica left: START there with its state
                stream.live_in_triton, stream.replica = False, replica.endpoint
            client = replica.member.client
            assert client is not None
            start = not stream.live_in_triton
            inputs = [_tensor(self.model_input, window)]
            if start and resuming:
                for state_input, state_output in self.state_map.items():
                    inputs.append(_tensor(state_input, resume_state[state_output]))
            sid = stream.sequence_id or sequence_id(stream.key, self.owner)
            stream.sequence_id = sid
            try:
                async with self._slots:
                    with call_span(self._call_span, traced, attributes={"triton.sequence_id": sid}):
                        response = await client.infer(
                            self.model,
                            inputs,
                            model_version=self.model_version,
                            outputs=outputs,
                            sequence_id=sid,
                            sequence_start=start,
                            sequence_end=end,
                            client_timeout=self.call_timeout_s,
                            headers=grpc_metadata(),
                        )
            except Exception as exc:
                stream.live_in_triton = False  # whatever happened, resume with explicit state
                raise SequenceCallFailed(replica, exc) from exc
            except BaseException:
                stream.live_in_triton = False
                raise
            stream.live_in_triton = not end
            return {name: response.as_numpy(name)[0] for name in names}

        return await call_with_retry(
            attempt, self._classify, self.retry, label=f"model {self.model}", on_retry=on_retry
        )


    async def infer_frames(
        self,
        stream: StreamHandle,
        work: StreamState,
        frames: list[np.ndarray],
        *,
        ending: bool,
        on_retry: Callable[[Failure], None] | None = None,
        traced: Span | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """A chunk's frames in order; ``work`` (the stream's state being built) gets each
        frame's state outputs and its frame count. Raises :class:`GaveUp` on the first
        frame the policy gives up on."""
        results = []
        for i, window in enumerate(frames):
            output = await self.infer(
                stream,
                window,
                resume_state=work.model_state,
                resuming=work.frames_done > 0,
                end=ending and i == len(frames) - 1,
                on_retry=on_retry,
                traced=traced,
            )
            for state_output in self.state_map.values():
                work.model_state[state_output] = np.asarray(output[state_output], dtype=np.float32)
            work.frames_done += 1
            results.append(output)
        return results

    def frame_tensors(self, work: StreamState, outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """A chunk result's tensors: each reported output stacked over the chunk's frames,
        and the frames' indices in the stream."""
        tensors = {
            name: np.stack([np.asarray(o[name]) for o in outputs]) if outputs else np.zeros((0,), np.float32)
            for name in self.result_outputs
        }
        tensors["frame_index"] = np.arange(work.frames_done - len(outputs), work.frames_done, dtype=np.int64)
        return tensors


def _forgot_sequence(exc: BaseException) -> bool:
    """Triton dropped the sequence (its idle timeout reclaimed the slot) and wants START again."""
    return isinstance(exc, InferenceServerException) and "must specify the START flag" in str(exc.message() or "")


def sequence_id(key: bytes, owner: bytes = b"") -> int:
    """A non-zero 63-bit Triton correlation ID for a stream key, stable for one ``owner``
    (a worker: the key's next owner calls another sequence; the old one idles out)."""
    digest = int.from_bytes(hashlib.blake2b(key, digest_size=8, salt=owner[:16]).digest(), "big")
    return (digest & ((1 << 63) - 1)) or 1


def _tensor(name: str, array: np.ndarray) -> InferInput:
    data = np.asarray(array, dtype=np.float32)[None, ...]
    tensor = InferInput(name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor
