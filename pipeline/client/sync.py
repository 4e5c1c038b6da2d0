"""A blocking client for scripts and notebooks: the asyncio :class:`Client` on its own loop.

The loop runs in a daemon thread owned by the :class:`SyncClient`; every call is handed
to it with :func:`asyncio.run_coroutine_threadsafe` and waited for. So it works where an
event loop is already running in the caller's thread (Jupyter) as well as in plain
scripts, and several threads may call one SyncClient at once.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np
from typing_extensions import Self

from pipeline.client.client import Client
from pipeline.client.errors import ClientError
from pipeline.client.result import InferResult
from pipeline.client.waiters import ClientStats
from pipeline.settings import KafkaSettings
from pipeline.topology.model import Topology

T = TypeVar("T")


class SyncClient:
    """``with SyncClient("topologies/dense.yaml") as c: r = c.infer({"features": x})``."""

    def __init__(
        self, topology: Topology | str | os.PathLike[str], *, kafka: KafkaSettings | None = None, **options: Any
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pipeline-client-loop", daemon=True)
        self._thread.start()
        self.client = Client(topology, kafka=kafka, **options)
        try:
            self._run(self.client.start())
        except BaseException:
            self._stop_loop()
            raise

    @property
    def stats(self) -> ClientStats:
        return self.client.stats

    def infer(self, inputs: Mapping[str, Any] | np.ndarray, **options: Any) -> InferResult:
        """:meth:`Client.infer`, blocking."""
        return self._run(self.client.infer(inputs, **options))

    def infer_many(
        self, inputs: Iterable[Mapping[str, Any] | np.ndarray], **options: Any
    ) -> list[InferResult | ClientError]:
        """:meth:`Client.infer_many`, blocking: every result, in input order."""

        async def collect() -> list[InferResult | ClientError]:
            return [r async for r in self.client.infer_many(inputs, **options)]

        return self._run(collect())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self.client.close())
        finally:
            self._stop_loop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
