"""Live model management: push, load, unload and version pinning under a running pipeline.

Each test works on a *private* model (``dense_live_<uuid8>``), never on the
sample models other tests rely on: the same 16->32->4 MLP as
``dense_classifier`` (its ``model.py`` copied), with weights this file
generates per version, so every result can be checked against a numpy
reference of the version its ``model-version`` header names. The model is
pushed to the session's S3 store and loaded with the real ``pipeline models``
CLI; a finalizer unloads it and deletes it from the store, leaving the
session's Triton as it was.

What Triton 2.51 does (explicit model control, observed): loading version 2
with the default version policy (latest 1) keeps v1 serving until v2 is READY,
then unloads v1 after its in-flight requests; no request fails. After an
unload, requests fail at once ("has no available versions"); see
``workers/stateless/triton_backend.py`` for how the stage classifies that.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from pipeline.contract.errors import ErrorClass
from pipeline.contract.records import Record, read_dead_letter
from pipeline.contract.request import decode_request, encode_request
from pipeline.contract.response import decode_response
from pipeline.errors import PipelineError
from pipeline.failure_policy import FailureKind
from pipeline.modelstore.store import ModelStore
from pipeline.settings import S3Settings, TritonSettings
from pipeline.triton.admin import TritonAdmin
from pipeline.triton.client import sync_client
from tests.helpers.kafka_io import collect, header, produce
from tests.helpers.topology_process import TopologyFiles, pipeline_process, write_topology
from workers.stateless.triton_backend import TritonModelBackend

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.s3, pytest.mark.slow]

Rec = ConsumerRecord[bytes, bytes]
REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_PY = REPO_ROOT / "sample_models" / "dense_classifier" / "1" / "model.py"
IN_FEATURES, HIDDEN, CLASSES = 16, 32, 4

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "features" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{policy}"""


# ------------------------------------------------------------------ the private model


def _weights(version: int) -> dict[str, np.ndarray]:
    """Version ``v``'s weights: the sample MLP's shape, drawn from seed 1000 + v."""
    rng = np.random.default_rng(1000 + version)
    return {
        "w1": (rng.standard_normal((HIDDEN, IN_FEATURES)) * np.sqrt(2.0 / IN_FEATURES)).astype(np.float32),
        "b1": (rng.standard_normal(HIDDEN) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((CLASSES, HIDDEN)) * np.sqrt(2.0 / HIDDEN)).astype(np.float32),
        "b2": (rng.standard_normal(CLASSES) * 0.1).astype(np.float32),
    }


def _graph(version: int) -> onnx.ModelProto:
    """features [batch, 16] -> Gemm -> Relu -> Gemm -> logits [batch, 4] (opset 13, IR 7)."""
    nodes = [
        helper.make_node("Gemm", ["features", "w1", "b1"], ["h1"], transB=1),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "w2", "b2"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        f"dense_live_v{version}",
        inputs=[helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", IN_FEATURES])],
        outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        initializer=[numpy_helper.from_array(a, n) for n, a in _weights(version).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model


def reference(version: int, features: np.ndarray) -> np.ndarray:
    """Logits of ``version`` for ``features`` [rows, 16], in float64."""
    w = {k: v.astype(np.float64) for k, v in _weights(version).items()}
    hidden = np.maximum(features.astype(np.float64) @ w["w1"].T + w["b1"], 0.0)
    return hidden @ w["w2"].T + w["b2"]


@dataclass
class LiveModel:
    """A private model: its local directory (what gets pushed) and the CLI environment."""

    name: str
    root: Path  # a repository holding only this model
    env: dict[str, str]
    version_policy: str = ""
    pushed: list[list[int]] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.root / self.name

    def write(self, versions: list[int]) -> Path:
        """Rewrite the local model directory to hold exactly ``versions``."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir(parents=True)
        (self.path / "config.pbtxt").write_text(CONFIG.format(name=self.name, policy=self.version_policy))
        for v in versions:
            (self.path / str(v)).mkdir()
            shutil.copy(MODEL_PY, self.path / str(v) / "model.py")
            onnx.save(_graph(v), str(self.path / str(v) / "model.onnx"))
        return self.path

    def push(self, versions: list[int], *, load: bool = False) -> str:
        """``pipeline models push DIR [--load]``: the store's copy becomes exactly ``versions``."""
        self.write(versions)
        self.pushed.append(versions)
        return cli(self.env, "models", "push", str(self.path), *(["--load"] if load else []))

    def load(self) -> str:
        return cli(self.env, "models", "load", self.name)

    def unload(self) -> str:
        return cli(self.env, "models", "unload", self.name)


def cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        env=dict(env, COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"pipeline {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def live_model(
    cli_env: dict[str, str], s3_settings: S3Settings, triton_settings: TritonSettings, tmp_path: Path
) -> Iterator[Callable[..., LiveModel]]:
    """Make private models; every one is unloaded and deleted from the store afterwards."""
    made: list[LiveModel] = []

    def make(version_policy: str = "") -> LiveModel:
        model = LiveModel(
            name=f"dense_live_{uuid.uuid4().hex[:8]}",
            root=tmp_path / f"repo-{len(made)}",
            env=cli_env,
            version_policy=version_policy,
        )
        made.append(model)
        return model

    yield make
    store = ModelStore(s3_settings)
    with TritonAdmin(triton_settings) as admin:
        for model in made:
            if any(e.state in ("READY", "LOADING") for e in admin.model_states(model.name)):
                admin.unload(model.name)
            if model.pushed:
                try:
                    store.delete_model(model.name)
                except PipelineError:
                    pass  # never got there


# ------------------------------------------------------------------ helpers


def _requests(n: int, prefix: str, seed: int, **extra: str) -> tuple[list[Record], np.ndarray]:
    features = np.random.default_rng(seed).standard_normal((n, IN_FEATURES)).astype(np.float32)
    records = [
        encode_request({"features": features[i : i + 1]}, correlation_id=f"{prefix}-{i}", **extra) for i in range(n)
    ]
    return records, features


def _collect_ids(bootstrap: str, topo: TopologyFiles, ids: set[str], timeout: float = 120) -> tuple[list[Rec], list[Rec]]:
    """Results and dead letters of ``ids`` (read from the beginning until each has an answer)."""

    def answered(records: list[Rec]) -> bool:
        return ids <= {r.key.decode() for r in records if r.key is not None}

    out = asyncio.run(collect(bootstrap, [topo.result_topic, topo.dead_letter_topic], done=answered, timeout=timeout))
    results = [r for r in out.on(topo.result_topic) if r.key is not None and r.key.decode() in ids]
    dead = [r for r in out.on(topo.dead_letter_topic) if r.key is not None and r.key.decode() in ids]
    return results, dead


def _version_checked(record: Rec, features: np.ndarray, prefix: str, model: str) -> str:
    """The version a result names (header and body agree); its logits are that version's."""
    response = decode_response(record.value, record.headers)
    version = header(record, "model-version")
    assert version is not None and response.model_version == version
    assert header(record, "model-name") == response.model_name == model
    index = int(response.correlation_id.removeprefix(f"{prefix}-"))
    np.testing.assert_allclose(
        response.outputs["logits"], reference(int(version), features[index : index + 1]), rtol=1e-4, atol=1e-5
    )
    return version


def _triton_infer_version(url: str, model: str) -> str:
    """The version Triton itself serves for a request that names none."""
    client = sync_client(TritonSettings(grpc_url=url))
    try:
        tensor = InferInput("features", [1, IN_FEATURES], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, IN_FEATURES), np.float32))
        return str(client.infer(model, [tensor]).get_response().model_version)
    finally:
        client.close()


# ------------------------------------------------------------------ hot reload


def test_hot_reload_under_steady_stream_switches_to_version_2_without_losing_a_request(
    live_model: Callable[..., LiveModel],
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """200 requests/s; after 4 s version 2 is pushed and loaded; the stream goes on 5 s more.

    The pushed copy holds ``1/`` and ``2/`` (a store keeps its history, so a
    rollback is a config change away); with the default version policy
    (latest 1) Triton serves only the highest version. The stream runs until
    5 s after ``load`` returned rather than for a fixed time, so a slow push
    on a busy machine cannot leave the switch outside it.
    """
    model = live_model()
    model.push([1], load=True)
    topo = write_topology(tmp_path, partitions=4, stage={"model": model.name})
    stream = _Stream(kafka_bootstrap, topo.input_topic, "hot", rate=200.0, seed=11)
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        stream.start()
        time.sleep(4)
        push_started_ms = _now_ms()
        model.push([1, 2])
        pushed_ms = _now_ms()
        load_output = model.load()
        loaded_ms = _now_ms()
        assert "READY: v2" in load_output, load_output
        time.sleep(5)
        n = stream.stop()
        results, dead = _collect_ids(kafka_bootstrap, topo, {f"hot-{i}" for i in range(n)}, timeout=120)
        assert worker.get("/healthz")[0] == 200
        assert worker.terminate() == 0, worker.log()
        log_text = worker.log_path.read_text(errors="replace")

    assert dead == [], [read_dead_letter(r.headers) for r in dead[:5]]
    counts = Counter(r.key.decode() for r in results if r.key is not None)
    assert len(counts) == n and set(counts.values()) == {1}, "every request gets exactly one result"
    versions = {
        r.key.decode(): _version_checked(r, stream.features, "hot", model.name) for r in results if r.key is not None
    }

    # Per partition, the results leave in arrival order: the version never goes back.
    by_partition: dict[int, list[Rec]] = defaultdict(list)
    for record in sorted(results, key=lambda r: (r.partition, r.offset)):
        by_partition[record.partition].append(record)
    for partition, rs in by_partition.items():
        seq = [int(versions[r.key.decode()]) for r in rs if r.key is not None]
        assert seq == sorted(seq), f"partition {partition}: version went back"
        assert seq[-1] == 2, f"partition {partition}: last result is not version 2"

    # Requests sent after `load` returned are answered by v2; before the push only v1 existed.
    sent = stream.sent_ms
    late = [cid for cid, ts in sent.items() if ts > loaded_ms]
    assert late and all(versions[cid] == "2" for cid in late)
    per_version = Counter(versions.values())
    assert per_version["1"] > 0 and per_version["2"] > 0
    assert f"model {model.name}: now serving version 2 (was 1)" in log_text
    first_v2 = min(sent[cid] for cid, v in versions.items() if v == "2")
    last_v1 = max(sent[cid] for cid, v in versions.items() if v == "1")
    print(
        f"\nhot reload of {model.name}: {n} requests, {per_version['1']} answered by v1, "
        f"{per_version['2']} by v2, 0 dead letters, 0 duplicates; push took "
        f"{(pushed_ms - push_started_ms) / 1000:.1f}s, load {(loaded_ms - pushed_ms) / 1000:.1f}s; "
        f"last v1 request sent {(last_v1 - pushed_ms) / 1000:+.2f}s and first v2 request "
        f"{(first_v2 - pushed_ms) / 1000:+.2f}s from the start of the load"
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Stream:
    """A steady stream of requests from a thread, until :meth:`stop`; remembers send times."""

    def __init__(self, bootstrap: str, topic: str, prefix: str, *, rate: float, seed: int, limit: int = 30_000) -> None:
        self.bootstrap, self.topic, self.prefix, self.rate = bootstrap, topic, prefix, rate
        self.features = np.random.default_rng(seed).standard_normal((limit, IN_FEATURES)).astype(np.float32)
        self.sent_ms: dict[str, int] = {}
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name=f"stream-{prefix}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        """Stop, wait until everything sent is acknowledged; returns how many were sent."""
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive() and not self._errors, self._errors
        return len(self.sent_ms)

    def _run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:
            self._errors.append(exc)

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5, acks="all")
        await producer.start()
        try:
            started = time.monotonic()
            pending = []
            for i in range(len(self.features)):
                if self._stop.is_set():
                    break
                delay = started + i / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                cid = f"{self.prefix}-{i}"
                record = encode_request({"features": self.features[i : i + 1]}, correlation_id=cid)
                timestamp = _now_ms()
                pending.append(
                    await producer.send(
                        self.topic, record.value, key=record.key, headers=record.headers, timestamp_ms=timestamp
                    )
                )
                self.sent_ms[cid] = timestamp
            await asyncio.gather(*pending)
        finally:
            await producer.stop()


# ------------------------------------------------------------------ pinned version


def test_pinned_version_keeps_serving_version_1_after_version_2_is_loaded(
    live_model: Callable[..., LiveModel],
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    triton_grpc_url: str,
    triton_settings: TritonSettings,
    tmp_path: Path,
) -> None:
    # Keep every version loaded; with the default (latest 1) v1 would go away.
    model = live_model(version_policy="version_policy: { all { } }\n")
    model.push([1], load=True)
    topo = write_topology(tmp_path, partitions=2, stage={"model": model.name, "model_version": "1"})
    before, f_before = _requests(40, "pin-before", seed=21)
    after, f_after = _requests(40, "pin-after", seed=22)
    named_1, f_named_1 = _requests(1, "pin-named-1", seed=23, model_version="1")
    named_2, _ = _requests(1, "pin-named-2", seed=24, model_version="2")
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, before))
        results, dead = _collect_ids(kafka_bootstrap, topo, {f"pin-before-{i}" for i in range(40)})
        assert dead == [] and {_version_checked(r, f_before, "pin-before", model.name) for r in results} == {"1"}

        model.push([1, 2])
        model.load()
        with TritonAdmin(triton_settings) as admin:
            states = {e.version: e.state for e in admin.model_states(model.name)}
        assert states == {"1": "READY", "2": "READY"}, states
        assert _triton_infer_version(triton_grpc_url, model.name) == "2", "unpinned requests get v2"

        asyncio.run(produce(kafka_bootstrap, topo.input_topic, after + named_1 + named_2))
        ids = {f"pin-after-{i}" for i in range(40)} | {"pin-named-1-0", "pin-named-2-0"}
        results, dead = _collect_ids(kafka_bootstrap, topo, ids)
        assert worker.terminate() == 0, worker.log()

    by_id = {r.key.decode(): r for r in results if r.key is not None}
    assert set(by_id) == ids - {"pin-named-2-0"}
    assert {_version_checked(by_id[f"pin-after-{i}"], f_after, "pin-after", model.name) for i in range(40)} == {"1"}
    assert _version_checked(by_id["pin-named-1-0"], f_named_1, "pin-named-1", model.name) == "1"
    assert [r.key for r in dead] == [b"pin-named-2-0"]
    letter = read_dead_letter(dead[0].headers)
    assert letter.error_class == "model-version-mismatch", letter
    assert "pins version 1" in letter.reason
    print(f"\npinned v1 of {model.name}: 80 results from v1 while Triton also serves v2; {letter.reason}")


# ------------------------------------------------------------------ unload


@pytest.mark.parametrize("pin", ["", "1"], ids=["latest", "pinned"])
def test_unloaded_model_makes_requests_wait_and_serves_them_after_load(
    pin: str,
    live_model: Callable[..., LiveModel],
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """An unloaded model is an outage of its stage (pipeline/triton/failures.py says why):
    requests wait, nothing is dead-lettered, and all are served once it is loaded again."""
    model = live_model()
    model.push([1], load=True)
    topo = write_topology(tmp_path, partitions=2, stage={"model": model.name, "model_version": pin})
    batches = {name: _requests(20, f"unload-{name}", seed=30 + i) for i, name in enumerate(("before", "gone", "back"))}

    def send(name: str, timeout: float = 120) -> tuple[list[Rec], list[Rec]]:
        records, _ = batches[name]
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        return _collect_ids(kafka_bootstrap, topo, {f"unload-{name}-{i}" for i in range(20)}, timeout=timeout)

    with pipeline_process(topo, cli_env, tmp_path) as worker:
        results, dead = send("before")
        assert len(results) == 20 and dead == []

        assert f"unloaded {model.name}" in model.unload()
        results, gone = send("gone", timeout=8)
        assert results == [] and gone == [], "requests for an unloaded model wait"
        assert worker.proc is not None and worker.proc.poll() is None, "the worker must not crash"
        assert worker.get("/healthz")[0] == 200
        retries = worker.metric("pipeline_triton_retries_total")

        model.load()
        results, dead = send("back")
        waited, dead_gone = _collect_ids(kafka_bootstrap, topo, {f"unload-gone-{i}" for i in range(20)})
        dead_metric = worker.metric("pipeline_dead_letters_total")
        assert worker.terminate() == 0, worker.log()

    assert dead == dead_gone == [] and dead_metric == 0, [read_dead_letter(r.headers) for r in dead + dead_gone]
    assert retries > 0, "the stage never found the model missing"
    for name, answered in (("gone", waited), ("back", results)):
        _, features = batches[name]
        assert len(answered) == 20
        assert {_version_checked(r, features, f"unload-{name}", model.name) for r in answered} == {"1"}
    print(f"\nunload ({pin or 'latest'}): 20 requests waited ({retries:.0f} retries), all served after load")


# ------------------------------------------------------------------ the backend itself


def test_backend_follows_a_version_switch_and_classifies_an_unloaded_model(
    live_model: Callable[..., LiveModel], triton_settings: TritonSettings
) -> None:
    """``TritonModelBackend`` alone against the real Triton: a pinned backend sends its
    version, a following one describes the model again after the switch, and a call to
    an unloaded model is a ``model-unavailable`` outage (waited out, not dead-lettered)."""
    model = live_model(version_policy="version_policy: { all { } }\n")
    model.push([1], load=True)
    features = np.random.default_rng(41).standard_normal((3, IN_FEATURES)).astype(np.float32)
    record = encode_request({"features": features}, correlation_id="backend-0")
    request = decode_request(record.value, list(record.headers or ()))

    async def scenario() -> None:
        latest = TritonModelBackend(triton_settings, model.name)
        pinned = TritonModelBackend(triton_settings, model.name, "1")
        for backend in (latest, pinned):
            await backend.setup()
        try:
            assert latest.description is not None and latest.description.versions == [1]
            for backend in (latest, pinned):
                backend.check(request)
                out = await backend.run([request])
                assert out.model_version == "1"
                np.testing.assert_allclose(out.outputs[0]["logits"], reference(1, features), rtol=1e-4, atol=1e-5)

            await asyncio.to_thread(model.push, [1, 2])
            await asyncio.to_thread(model.load)
            out = await latest.run([request])
            assert out.model_version == "2"
            np.testing.assert_allclose(out.outputs[0]["logits"], reference(2, features), rtol=1e-4, atol=1e-5)
            assert (await pinned.run([request])).model_version == "1", "the pin goes to Triton"
            deadline = time.monotonic() + 10
            while latest.description.versions != [1, 2] and time.monotonic() < deadline:  # noqa: ASYNC110 - polls another task's result
                await asyncio.sleep(0.05)
            assert latest.description.versions == [1, 2], "described again after the switch"

            await asyncio.to_thread(model.unload)
            for backend in (latest, pinned):
                with pytest.raises(InferenceServerException) as raised:
                    await backend.run([request])
                failure = await backend.classify(raised.value)
                assert failure.kind is FailureKind.OUTAGE, failure
                assert failure.error_class is ErrorClass.MODEL_UNAVAILABLE, failure
                assert f"model {model.name!r} is not loaded on Triton" in failure.reason
                print(f"\n{backend.model_version or 'latest'}: {raised.value.status()} -> {failure}")

            # Loaded again: until Triton's index says READY, a failure is an outage (wait).
            loading = asyncio.create_task(asyncio.to_thread(model.load))
            kinds: list[FailureKind] = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    out = await latest.run([request])
                    break
                except InferenceServerException as exc:
                    kinds.append((await latest.classify(exc)).kind)
                    await asyncio.sleep(0.02)
            await loading
            assert out.model_version == "2"
            # Until it is READY a request waits (outage) or retries (transient: it became
            # READY between the failure and the index read); it is never dead-lettered.
            assert FailureKind.OUTAGE in kinds and FailureKind.PERMANENT not in kinds, kinds
            print(
                f"while loading again: {kinds.count(FailureKind.OUTAGE)} outages (not loaded yet), "
                f"{kinds.count(FailureKind.TRANSIENT)} transient (READY by the index read), then served"
            )
        finally:
            for backend in (latest, pinned):
                await backend.close()

    asyncio.run(scenario())
