"""The stateless stage's Triton fleet (workers/stateless/fleet_backend.py) over in-memory
replicas behind the backend's real seams: which replica a batch goes to, what a replica's
outage does to a batch under the stage's one failure policy, and replicas joining and
leaving. The fleet on real Triton servers is tests/integration/test_triton_fleet.py."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence

import numpy as np
import pytest

from pipeline.contract.errors import ErrorClass
from pipeline.contract.request import InferenceRequest, decode_request, encode_request
from pipeline.errors import ConfigError
from pipeline.failure_policy import Failure, FailureKind, RetryPolicy, call_with_retry
from pipeline.observability.tracing import CallSpan
from pipeline.settings import TritonSettings
from pipeline.triton.replica_set import NoReplicaUp
from pipeline.triton.replicas import ReplicaSpec, one_server, replica_settings, replica_spec
from workers.stateless.backend import BatchOutput
from workers.stateless.fleet_backend import FleetBackend

OUTAGE = Failure(FailureKind.OUTAGE, ErrorClass.MODEL_UNAVAILABLE, "failed to connect")
PERMANENT = Failure(FailureKind.PERMANENT, ErrorClass.INFERENCE_FAILED, "bad input")


class Down(Exception):
    """What a replica that is out raises."""


class FakeReplica:
    """A replica: answers with its own endpoint, or fails as told; counts its calls."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.name, self.device = "m", None
        self.call_span = CallSpan("infer", remote=True, attributes={})
        self.calls = 0
        self.failing: Failure | None = None
        self.answers_ready = True
        self.setup_error: Exception | None = None
        self.setup_gate: asyncio.Event | None = None
        self.closed = False
        self.hold: asyncio.Event | None = None

    async def setup(self) -> int:
        if self.setup_gate is not None:
            await self.setup_gate.wait()
        if self.setup_error is not None:
            raise self.setup_error
        return 8

    async def close(self) -> None:
        self.closed = True

    async def warmup(self) -> None: ...

    def check(self, request: InferenceRequest) -> object:
        return None

    def rows(self, request: InferenceRequest) -> int:
        return 1

    def batch_key(self, request: InferenceRequest) -> Hashable:
        return "k"

    async def run(self, requests: Sequence[InferenceRequest], prepared: Sequence[object]) -> BatchOutput:
        self.calls += 1
        if self.hold is not None:
            await self.hold.wait()
        if self.failing is not None:
            raise Down(self.endpoint)
        return BatchOutput([{"served_by": np.array([self.endpoint])} for _ in requests], "m", "1")

    async def classify(self, exc: BaseException) -> Failure:
        assert self.failing is not None
        return self.failing

    async def ready(self) -> bool:
        return self.answers_ready


def _fleet(endpoints: list[str], **kwargs: float) -> tuple[FleetBackend, dict[str, FakeReplica]]:
    made: dict[str, FakeReplica] = {}

    def make(endpoint: str) -> FakeReplica:
        made[endpoint] = FakeReplica(endpoint)
        return made[endpoint]

    fleet = FleetBackend(
        ReplicaSpec(tuple(endpoints), ()), make, name="m", call_span=CallSpan("infer", remote=True, attributes={}), **kwargs
    )
    return fleet, made


_REQUEST = encode_request({"x": np.zeros((1, 2), np.float32)}, correlation_id="c-1")
REQUEST = decode_request(_REQUEST.value, _REQUEST.headers)


async def _served_by(fleet: FleetBackend) -> str:
    output = await fleet.run([REQUEST], [None])
    return str(output.outputs[0]["served_by"][0])


async def test_batches_go_to_the_least_busy_replica_and_rotate_when_all_are_idle() -> None:
    fleet, replicas = _fleet(["a:1", "b:1", "c:1"])
    assert await fleet.setup() == 8
    try:
        assert [await _served_by(fleet) for _ in range(6)] == ["a:1", "b:1", "c:1", "a:1", "b:1", "c:1"]
        # a is busy with a call that has not returned: the next two batches go to b and c, then a's turn again
        replicas["a:1"].hold = asyncio.Event()
        busy = asyncio.create_task(_served_by(fleet))
        await asyncio.sleep(0)
        assert [await _served_by(fleet) for _ in range(4)] == ["b:1", "c:1", "b:1", "c:1"]
        replicas["a:1"].hold.set()
        assert await busy == "a:1"
    finally:
        await fleet.close()
    assert all(r.closed for r in replicas.values())


async def test_a_replica_s_outage_is_retried_on_another_and_the_replica_comes_back_when_ready() -> None:
    fleet, replicas = _fleet(["a:1", "b:1"], probe_every_s=0.01)
    await fleet.setup()
    try:
        replicas["a:1"].failing, replicas["a:1"].answers_ready = OUTAGE, False
        retried: list[Failure] = []

        async def attempt() -> str:
            return await _served_by(fleet)

        served = await call_with_retry(
            attempt,
            fleet.classify,
            RetryPolicy(max_attempts=2, initial_backoff_s=0.001, max_backoff_s=0.001),
            label="test",
            on_retry=retried.append,
        )
        assert served == "b:1" and replicas["a:1"].calls == 1
        assert [f.kind for f in retried] == [FailureKind.TRANSIENT] and "retried on another" in retried[0].reason
        assert [await _served_by(fleet) for _ in range(3)] == ["b:1"] * 3  # a is out
        replicas["a:1"].failing, replicas["a:1"].answers_ready = None, True
        for _ in range(100):
            if fleet.replicas.replicas["a:1"].up:
                break
            await asyncio.sleep(0.01)
        assert {await _served_by(fleet) for _ in range(2)} == {"a:1", "b:1"}
    finally:
        await fleet.close()


async def test_with_every_replica_out_it_is_the_stage_s_outage() -> None:
    fleet, replicas = _fleet(["a:1", "b:1"], probe_every_s=60)
    await fleet.setup()
    try:
        for replica in replicas.values():
            replica.failing = OUTAGE
        kinds = []
        for _ in range(2):
            with pytest.raises(Exception) as caught:
                await _served_by(fleet)
            kinds.append((await fleet.classify(caught.value)).kind)
        assert kinds == [FailureKind.TRANSIENT, FailureKind.OUTAGE]  # the first while the other was still up
        with pytest.raises(NoReplicaUp) as none_up:
            await _served_by(fleet)
        assert (await fleet.classify(none_up.value)).kind is FailureKind.OUTAGE
    finally:
        await fleet.close()


async def test_a_request_s_own_failure_is_the_replica_s_classification_and_keeps_it_in() -> None:
    fleet, replicas = _fleet(["a:1", "b:1"])
    await fleet.setup()
    try:
        replicas["a:1"].failing = PERMANENT
        with pytest.raises(Exception) as caught:
            await _served_by(fleet)
        assert await fleet.classify(caught.value) == PERMANENT
        assert fleet.replicas.replicas["a:1"].up
    finally:
        await fleet.close()


async def test_ready_once_one_replica_is_and_a_replica_that_failed_to_set_up_is_tried_again() -> None:
    made: dict[str, FakeReplica] = {}
    gate = asyncio.Event()

    def make(endpoint: str) -> FakeReplica:
        replica = made[endpoint] = FakeReplica(endpoint)
        if endpoint == "slow:1":
            replica.setup_gate = gate
        if endpoint == "broken:1":
            replica.setup_error = ConnectionError("refused")  # until the test clears it
        return replica

    spec = ReplicaSpec(("slow:1", "broken:1", "fast:1"), ())
    fleet = FleetBackend(spec, make, name="m", call_span=CallSpan("infer", remote=True, attributes={}), probe_every_s=0.01)
    await asyncio.wait_for(fleet.setup(), 1)  # slow:1 never finished: ready on fast:1 alone
    try:
        assert [r.endpoint for r in fleet.replicas.replicas.values() if r.up] == ["fast:1"]
        made["broken:1"].setup_error = None  # its next setup succeeds
        gate.set()
        for _ in range(200):
            if all(r.up for r in fleet.replicas.replicas.values()):
                break
            await asyncio.sleep(0.01)
        assert all(r.up for r in fleet.replicas.replicas.values())
    finally:
        await fleet.close()


async def test_every_replica_failing_to_set_up_fails_setup_and_none_configured_says_so() -> None:
    def broken(endpoint: str) -> FakeReplica:
        replica = FakeReplica(endpoint)
        replica.setup_error = ConnectionError("refused")
        return replica

    span = CallSpan("infer", remote=True, attributes={})
    fleet = FleetBackend(ReplicaSpec(("a:1", "b:1"), ()), broken, name="m", call_span=span)  # type: ignore[arg-type]
    with pytest.raises(NoReplicaUp, match="no Triton replica could be set up"):
        await fleet.setup()
    await fleet.close()
    with pytest.raises(ConfigError, match="no Triton endpoint configured"):
        await FleetBackend(replica_spec(""), broken, name="m", call_span=span).setup()  # type: ignore[arg-type]


async def test_a_dns_name_s_new_addresses_join_and_vanished_ones_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [["10.0.0.1:8001"], ["10.0.0.1:8001", "10.0.0.2:8001"], ["10.0.0.2:8001"]]
    spec = ReplicaSpec((), (("triton-headless", 8001),))

    async def resolve(self: ReplicaSpec) -> list[str]:
        return answers[0] if len(answers) == 1 else answers.pop(0)

    monkeypatch.setattr(ReplicaSpec, "resolve", resolve)
    made: dict[str, FakeReplica] = {}

    def make(endpoint: str) -> FakeReplica:
        made[endpoint] = FakeReplica(endpoint)
        return made[endpoint]

    fleet = FleetBackend(spec, make, name="m", call_span=CallSpan("i", remote=True, attributes={}), probe_every_s=0.01, resolve_every_s=0.01)
    await fleet.setup()
    try:
        for _ in range(300):
            if list(fleet.replicas.replicas) == ["10.0.0.2:8001"]:
                break
            await asyncio.sleep(0.01)
        # 10.0.0.2 joined, then 10.0.0.1 vanished: it left, closed, and 10.0.0.2 answers the checks now
        assert list(fleet.replicas.replicas) == ["10.0.0.2:8001"] and made["10.0.0.1:8001"].closed
        assert {await _served_by(fleet) for _ in range(3)} == {"10.0.0.2:8001"}
        assert fleet.rows(REQUEST) == 1 and fleet.batch_key(REQUEST) == "k"
    finally:
        await fleet.close()


def test_grpc_url_names_one_server_a_list_or_a_dns_name() -> None:
    assert not replica_spec("triton:8001").several
    assert replica_spec("a:8001, b:8001") == ReplicaSpec(("a:8001", "b:8001"), ())
    assert replica_spec("dns:///triton-headless.ns.svc:8001").dns_names == (("triton-headless.ns.svc", 8001),)
    assert replica_spec("dns:///triton-headless:8001").several  # a name stands for all its addresses
    for bad in ("a:1,,b:1", "dns:///nopport", "dns:///h:x", "dns:///h:1,grpcs://b:1"):
        with pytest.raises(ConfigError):
            replica_spec(bad)
    settings = TritonSettings(grpc_url="a:1,b:1", keepalive_time_ms=1234)
    assert replica_settings(settings, "b:1").grpc_url == "b:1" and replica_settings(settings, "b:1").keepalive_time_ms == 1234
    with pytest.raises(ConfigError, match="stage 'vad' takes one Triton endpoint"):
        one_server(settings, "stage 'vad'")
    assert one_server(TritonSettings(grpc_url="a:1"), "x").grpc_url == "a:1"


async def test_a_dns_name_resolves_to_its_addresses() -> None:
    endpoints = await replica_spec("dns:///localhost:8001,other:9").resolve()
    assert endpoints[0] == "other:9" and set(endpoints[1:]) <= {"127.0.0.1:8001", "[::1]:8001"} and len(endpoints) > 1


def test_a_one_server_client_refuses_a_list_and_the_stack_needs_a_triton() -> None:
    """The CLI's admin calls (models, validate) talk to one server: a list is a one-line
    error naming it, not a connection to the host 'a:1,b'."""
    from pipeline.embedded.stack import EmbeddedStack
    from pipeline.triton.client import sync_client

    with pytest.raises(ConfigError, match="names several replicas"):
        sync_client(TritonSettings(grpc_url="a:1,b:1"))
    with pytest.raises(ConfigError, match="names several replicas"):
        sync_client(TritonSettings(grpc_url="dns:///triton:8001"))
    with pytest.raises(ConfigError, match="tritons must be at least 1"):
        EmbeddedStack(tritons=0)
