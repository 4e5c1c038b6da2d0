"""A sequence model on several Triton replicas (workers/sequence/model.py over
pipeline/triton/replica_set.py), with in-memory replicas behind the channel's seams: each
stream's frames all go to one replica, chosen by its key; when that replica is out the
stream moves to another at the frame that failed, starting there with START and its
state; a replica joining takes some streams and leaves the rest where they are. The real
thing, two Tritons and the audio topology, is tests/integration/test_triton_fleet.py."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from pipeline.failure_policy import RetryPolicy
from pipeline.settings import TritonSettings
from pipeline.triton.admin import ModelDescription, SequenceBatching, TensorSpec
from pipeline.triton.failures import TritonFailureClassifier
from pipeline.triton.replica_set import ReplicaSet
from pipeline.triton.replicas import replica_spec
from workers.sequence.model import SequenceChannel, SequenceModel, StreamHandle

FRAME = 4
DESCRIPTION = ModelDescription(
    name="vad",
    versions=[1],
    platform="python",
    backend="python",
    max_batch_size=0,
    inputs=[TensorSpec("x", "FP32", [FRAME], [FRAME]), TensorSpec("s_in", "FP32", [2], [2])],
    outputs=[TensorSpec("p", "FP32", [1], [1]), TensorSpec("s_out", "FP32", [2], [2])],
    sequence_batching=SequenceBatching("direct", 1_000_000, 0, [], 0, [], []),
)


class Response:
    def __init__(self, outputs: dict[str, np.ndarray]) -> None:
        self.outputs = outputs

    def as_numpy(self, name: str) -> np.ndarray:
        return self.outputs[name]


class FakeClient:
    """A replica's channel: a running sum per sequence as the model's state, which a START
    without a state input resets (so a stream restarted without its state gives other
    outputs, as a real stateful model would)."""

    def __init__(self, endpoint: str, calls: list[tuple[str, int, bool]]) -> None:
        self.endpoint, self.calls = endpoint, calls
        self.state: dict[int, float] = {}
        self.down = False

    async def infer(self, model: str, inputs: list[Any], *, sequence_id: int, sequence_start: bool, **_: Any) -> Response:
        if self.down:
            raise InferenceServerException("failed to connect to all addresses", status="StatusCode.UNAVAILABLE")
        self.calls.append((self.endpoint, sequence_id, sequence_start))
        given = {i.name(): i for i in inputs}
        frame = float(np.frombuffer(given["x"]._raw_content, np.float32).sum())
        if sequence_start:
            resumed = "s_in" in given
            self.state[sequence_id] = float(np.frombuffer(given["s_in"]._raw_content, np.float32)[0]) if resumed else 0.0
        elif sequence_id not in self.state:
            raise InferenceServerException("inference request for sequence 1 must specify the START flag")
        self.state[sequence_id] += frame + 1.0
        total = self.state[sequence_id]
        return Response({"p": np.array([[total]], np.float32), "s_out": np.array([[total, 0.0]], np.float32)})

    async def is_server_ready(self, **_: Any) -> bool:
        return not self.down

    async def is_model_ready(self, *_: Any, **__: Any) -> bool:
        return not self.down

    async def close(self) -> None: ...


class FakeChannel(SequenceChannel):
    def __init__(self, endpoint: str, calls: list[tuple[str, int, bool]]) -> None:
        super().__init__(TritonSettings(grpc_url=endpoint), "vad", "", 0.1)
        self.fake = FakeClient(endpoint, calls)

    async def setup(self) -> ModelDescription:
        self.client = self.fake  # type: ignore[assignment]
        self.classifier = TritonFailureClassifier(self.fake, "vad")  # type: ignore[arg-type]
        return DESCRIPTION

    async def ready(self) -> bool:
        return not self.fake.down


async def _model(endpoints: list[str]) -> tuple[SequenceModel, dict[str, FakeChannel], list[tuple[str, int, bool]]]:
    calls: list[tuple[str, int, bool]] = []
    channels: dict[str, FakeChannel] = {}

    def make(endpoint: str) -> FakeChannel:
        channels[endpoint] = FakeChannel(endpoint, calls)
        return channels[endpoint]

    model = SequenceModel(
        TritonSettings(grpc_url=",".join(endpoints)),
        "vad",
        state_map={"s_in": "s_out"},
        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.001),
    )
    model.replicas = ReplicaSet(
        replica_spec(",".join(endpoints)), make, lambda channel: channel.setup(), label="vad", probe_every_s=0.01
    )
    await model.setup("vad")
    return model, channels, calls


async def _frames(model: SequenceModel, stream: StreamHandle, state: dict[str, np.ndarray], n: int) -> list[float]:
    out = []
    for _ in range(n):
        result = await model.infer(stream, np.ones(FRAME, np.float32), resume_state=state, resuming=bool(state), end=False)
        state["s_out"] = np.asarray(result["s_out"], np.float32)
        out.append(float(result["p"][0]))
    return out


async def test_each_stream_stays_on_one_replica_chosen_by_its_key() -> None:
    model, _channels, calls = await _model(["a:1", "b:1", "c:1"])
    try:
        streams = [StreamHandle(f"stream-{i}".encode()) for i in range(30)]
        for stream in streams:
            await _frames(model, stream, {}, 3)
        by_stream: dict[int, set[str]] = defaultdict(set)
        for endpoint, sid, _start in calls:
            by_stream[sid].add(endpoint)
        assert all(len(endpoints) == 1 for endpoints in by_stream.values())
        used = {endpoint for endpoint, _sid, _start in calls}
        assert used == {"a:1", "b:1", "c:1"}  # 30 keys land on all three
        assert sum(1 for _e, _s, start in calls if start) == 30  # one START per stream
    finally:
        await model.close()


async def test_a_stream_whose_replica_is_out_moves_with_its_state_and_its_outputs_do_not_change() -> None:
    model, channels, calls = await _model(["a:1", "b:1"])
    try:
        stream, state = StreamHandle(b"the-stream"), {}
        first = await _frames(model, stream, state, 3)
        home = stream.replica
        assert home is not None
        channels[home].fake.down = True
        later = await _frames(model, stream, state, 3)
        assert stream.replica != home
        assert first + later == [5.0, 10.0, 15.0, 20.0, 25.0, 30.0]  # the same as on one replica throughout
        moved = [(e, start) for e, _sid, start in calls if e == stream.replica]
        assert moved[0] == (stream.replica, True)  # started on the other replica, with its state
        assert not model.replicas.replicas[home].up
        channels[home].fake.down = False
        for _ in range(200):
            if model.replicas.replicas[home].up:
                break
            await asyncio.sleep(0.01)
        # back: the key's own replica again, START with the state it has now
        assert await _frames(model, stream, state, 1) == [35.0] and stream.replica == home
    finally:
        await model.close()


async def test_a_replica_joining_takes_some_streams_and_leaves_the_others_where_they_were() -> None:
    keys = [f"k{i}".encode() for i in range(60)]
    two, _, _ = await _model(["a:1", "b:1"])
    three, _, _ = await _model(["a:1", "b:1", "c:1"])
    try:
        before = {k: two.replicas.by_key(k).endpoint for k in keys}
        after = {k: three.replicas.by_key(k).endpoint for k in keys}
        moved = [k for k in keys if before[k] != after[k]]
        assert all(after[k] == "c:1" for k in moved)  # only to the new one
        assert 10 <= len(moved) <= 30  # about a third
    finally:
        await two.close()
        await three.close()


async def test_one_server_is_never_taken_out() -> None:
    model, channels, _calls = await _model(["a:1"])
    try:
        channels["a:1"].fake.down = True
        stream = StreamHandle(b"s")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_frames(model, stream, {}, 1), 0.2)  # an outage: waited out, as before
        assert model.replicas.replicas["a:1"].up
    finally:
        await model.close()
