"""pipeline.client.faust in a real Faust worker against the real stack.

A `faust worker` child process (tests/helpers/faust_caller_app.py) reads events from two
source topics, calls a private copy of the dense topology run by `pipeline run` through
one :class:`TopologyCaller` (awaited per event, and pipelined through ``results``), and
writes every result to a sink topic. The test reads the sink back with a plain consumer:
every event answered exactly once, with the numpy reference's logits; an event the
topology dead-letters comes out of ``results`` as its typed error.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pipeline.contract.records import Record
from pipeline.kafka.clients import ensure_topics
from pipeline.settings import KafkaSettings
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.kafka_io import collect, produce, topic_names
from tests.helpers.topology_process import pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton]

EVENTS = 200


class FaustWorker:
    """``python -m tests.helpers.faust_caller_app worker``, its log, and the reply topic it announced."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        argv = [sys.executable, "-m", "tests.helpers.faust_caller_app", "worker", "-l", "warn", "--without-web"]
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 90.0) -> str:
        """The caller's reply topic, printed with READY once the app (and so the caller) started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            announced = re.search(r"READY (\S+)", self.log_path.read_text(errors="replace"))
            if announced:
                return announced.group(1)
            if self.proc.poll() is not None:
                raise AssertionError(f"faust worker exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.2)
        raise AssertionError(f"faust worker not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def faust_worker_factory(tmp_path: Path) -> Iterator[list[FaustWorker]]:
    workers: list[FaustWorker] = []
    yield workers
    for worker in workers:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(timeout=10)


def test_a_faust_agent_calls_the_topology_and_every_event_gets_its_result_once(
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
    faust_worker_factory: list[FaustWorker],
) -> None:
    topo = write_topology(tmp_path, partitions=2)
    run = uuid.uuid4().hex[:8]
    one_by_one, pipelined, sink = f"faust-{run}.one", f"faust-{run}.pipelined", f"faust-{run}.sink"
    asyncio.run(ensure_topics(KafkaSettings(bootstrap_servers=kafka_bootstrap), [one_by_one, pipelined, sink], partitions=2))
    features = random_features(2 * EVENTS, seed=1313)
    wanted = {f"one-{i}": features[i] for i in range(EVENTS)}
    wanted |= {f"pipe-{i}": features[EVENTS + i] for i in range(EVENTS)}
    env = dict(
        cli_env,
        PYTHONUNBUFFERED="1",
        FAUST_BOOTSTRAP=kafka_bootstrap,
        FAUST_APP_ID=f"faust-caller-{run}",
        FAUST_TOPOLOGY=str(topo.path),
        FAUST_ONE_BY_ONE=one_by_one,
        FAUST_PIPELINED=pipelined,
        FAUST_SINK=sink,
        FAUST_DATADIR=str(tmp_path / "faust-data"),
    )

    # Three features instead of 16: the topology dead-letters them (shape-mismatch).
    bad = [Record(f"bad-{i}".encode(), np.zeros(3, np.float32).tobytes(), []) for i in range(3)]

    with pipeline_process(topo, cli_env, tmp_path):
        worker = FaustWorker(env, tmp_path / "faust-worker.log")
        faust_worker_factory.append(worker)
        reply_topic = worker.wait_ready()
        assert reply_topic.startswith(f"{topo.result_topic}.reply.")

        def events(prefix: str) -> list[Record]:
            return [Record(key.encode(), row.tobytes(), []) for key, row in wanted.items() if key.startswith(prefix)]

        asyncio.run(produce(kafka_bootstrap, one_by_one, events("one-")))
        asyncio.run(produce(kafka_bootstrap, pipelined, events("pipe-") + bad))
        total = 2 * EVENTS + len(bad)
        got = asyncio.run(collect(kafka_bootstrap, [sink], done=lambda rs: len(rs) >= total, timeout=180))
        assert len(got.records) >= total, f"{len(got.records)} results:\n{worker.log()}"
        time.sleep(3)  # anything more would be a duplicate
        everything = asyncio.run(collect(kafka_bootstrap, [sink], done=lambda rs: len(rs) > total, timeout=5))
        assert reply_topic in asyncio.run(topic_names(kafka_bootstrap))
        assert worker.stop() == 0, worker.log()

    keys = [r.key.decode() for r in everything.records if r.key is not None]
    assert len(keys) == len(everything.records) == total
    assert set(keys) == set(wanted) | {f"bad-{i}" for i in range(len(bad))}
    for record in everything.records:
        assert record.key is not None and record.value is not None
        body = json.loads(record.value)
        key = record.key.decode()
        if key.startswith("bad-"):
            assert body == {"path": "results", "error": "RequestDeadLettered", "class": "shape-mismatch"}, body
            continue
        assert body["path"] == ("infer" if key.startswith("one-") else "results"), body
        assert "error" not in body, body
        np.testing.assert_allclose(
            np.asarray(body["logits"]), mlp_reference(wanted[key].reshape(1, 16)), rtol=1e-4, atol=1e-5
        )
    # The caller closed with the app: its client deleted the reply topic it made.
    assert reply_topic not in asyncio.run(topic_names(kafka_bootstrap))
