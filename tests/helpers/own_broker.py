"""A Kafka-protocol broker of one test's own, for tests that crash, restart or freeze it.

The session's broker is never touched: other tests go on using it. Apache Kafka keeps its log
on its own disk, so a kill -9 and a restart on the same ports find every acknowledged record
and committed offset there, as in production.

With ``log_store`` (an S3 store), Tansu keeps its log in a fresh bucket there (its
``s3://`` engine), so a broker killed with SIGKILL and started again on the same port has
every record it acknowledged and every offset a group committed, as a real Kafka broker
has on its disks. That engine is slow on this stack (the store is moto, a Python server,
and Tansu lists a partition's batches on every fetch), so only a crash test uses it, with
small workloads; a freeze (SIGSTOP) keeps the broker's memory, so it needs no store.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.embedded.process import SupervisedProcess
from pipeline.embedded.stack import Broker, EmbeddedStack
from pipeline.settings import S3Settings

S3_ENGINE_FETCH_MAX_WAIT_MS = 1000
"""Tansu's ``s3://`` engine answers a fetch that finds no batch read from the store within
``fetch.max.wait.ms`` with nothing at all; with the project's 25 ms every fetch came back
empty once a partition held a few hundred batches, so consumers wait longer here."""


@dataclass(frozen=True)
class OwnBroker:
    """The broker's process (``process.pause()`` / ``resume()`` freeze it: connections stay
    open, nothing answers), its bootstrap address, and a CLI environment pointed at it."""

    process: SupervisedProcess
    bootstrap: str
    env: dict[str, str]

    def crash(self, down_s: float) -> int:
        """``kill -9`` the broker, leave it down ``down_s`` seconds, start it again on the
        same port and storage; returns once it is ready again, with the wall-clock time (ms)
        its restart began: the fault's end. Not the time it answered ready: Apache Kafka
        takes its clients back while its readiness probe still waits for a group coordinator,
        and a stage can finish its work inside that wait (seen 2026-11-27: all 355 remaining
        results before "ready", so none "after the fault")."""
        self.process.kill()
        time.sleep(down_s)
        restarted_ms = int(time.time() * 1000)
        self.process.start()
        return restarted_ms


@contextlib.contextmanager
def start_own_broker(
    env: dict[str, str], log_dir: Path, *, log_store: S3Settings | None = None, broker: Broker = "tansu"
) -> Iterator[OwnBroker]:
    """Start the broker and stop it on leaving. Tansu keeps its log in ``log_store`` when given,
    else in memory; Apache Kafka (``broker="kafka"``) on its own disk, which a kill -9 keeps."""
    if broker == "kafka":
        stack = EmbeddedStack(services=("kafka",), log_dir=log_dir, broker="kafka")
        log_store = None  # its log is on disk already
    else:
        storage = "memory" if log_store is None else "s3"
        stack = EmbeddedStack(services=("kafka",), s3=log_store, log_dir=log_dir, broker_storage=storage)
    with stack:
        bootstrap = str(stack.endpoints.kafka.bootstrap_servers)
        broker_env = dict(env, PIPELINE_KAFKA_BOOTSTRAP_SERVERS=bootstrap)
        if log_store is not None:
            broker_env["PIPELINE_KAFKA_FETCH_MAX_WAIT_MS"] = str(S3_ENGINE_FETCH_MAX_WAIT_MS)
        yield OwnBroker(stack.process("kafka-broker"), bootstrap, broker_env)
