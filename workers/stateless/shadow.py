"""Shadow traffic: mirror each main batch to a second model, best effort, off the main path.

What the main route must never feel, whatever the shadow does:

- time: a mirrored batch is a task of its own, started after the main batch is
  dispatched; the main slot is completed (and committed) without waiting for it;
- failure: a shadow model missing, erroring or slow only changes the shadow's
  counter (``pipeline_shadow_total{outcome="failed"}``); no retries, no dead letters
  (the record already has its one outcome: the main route's);
- backpressure: at most ``max_inflight`` shadow calls run; a batch mirrored while
  they are all busy is dropped and counted (``outcome="dropped"``), never queued;
- the result topic: shadow results go to the shadow topic only, marked
  ``pipeline-route: shadow``, and are not counted as the stage's results.

A shadow model that cannot be described at start (not loaded yet) is tried again,
at most every ``RETRY_SETUP_S``, while requests keep coming; meanwhile each
mirrored request counts as failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from prometheus_client import Counter

from pipeline.contract.errors import BadRequest
from pipeline.contract.records import result_headers
from pipeline.contract.request import InferenceRequest
from pipeline.contract.response import encode_response
from pipeline.kafka.outbox import OutRecord
from pipeline.kafka.records import ConsumedRecord
from workers.stateless.tensor_map import TensorMap
from workers.stateless.triton_backend import TritonModelBackend

log = logging.getLogger(__name__)

SHADOW_ROUTE = "shadow"
RETRY_SETUP_S = 10.0


@dataclass(frozen=True)
class ShadowCopy:
    """One main request, as the shadow needs it."""

    record: ConsumedRecord
    message: InferenceRequest  # as it arrived (topology tensor names)
    request: InferenceRequest  # model tensor names


class ShadowMirror:
    """Mirror batches to ``backend``; results to ``topic`` (never awaited by the main path)."""

    def __init__(
        self,
        backend: TritonModelBackend,
        *,
        stage: str,
        topic: str,
        max_inflight: int,
        tensor_map: TensorMap,
        counter: Counter,
    ) -> None:
        self.backend, self.stage, self.topic = backend, stage, topic
        self.max_inflight = max_inflight
        self.tensor_map = tensor_map
        self._send: Callable[[list[OutRecord]], Awaitable[None]] | None = None
        self._sent, self._failed, self._dropped = (counter.labels(stage, o) for o in ("sent", "failed", "dropped"))
        self._ready = False
        self._setup: asyncio.Task[None] | None = None
        self._setup_at = -RETRY_SETUP_S
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, send: Callable[[list[OutRecord]], Awaitable[None]]) -> None:
        """Describe the shadow model in the background (the stage never waits for its shadow);
        ``send`` produces records no consumed record owns (the stage's unowned path)."""
        self._send = send
        self._try_setup()

    def _try_setup(self) -> None:
        if self._setup is not None and not self._setup.done():
            return
        if time.monotonic() - self._setup_at < RETRY_SETUP_S:
            return
        self._setup_at = time.monotonic()
        self._setup = asyncio.create_task(self._connect(), name=f"{self.stage}-shadow-setup")

    async def _connect(self) -> None:
        try:
            await self.backend.setup()
        except Exception as exc:  # noqa: BLE001 - any failure: the shadow is unavailable, counted
            log.warning("%s: shadow model %s unavailable (%s); mirrored requests count as failed",
                        self.stage, self.backend.model, " ".join(str(exc).split()))
            return
        self._ready = True
        log.info("%s: shadowing to %s -> %s", self.stage, self.backend.model, self.topic)

    def offer(self, copies: Sequence[ShadowCopy]) -> None:
        """Mirror one main batch now, or count why not; returns at once."""
        if not copies:
            return
        if not self._ready:
            self._try_setup()
            self._failed.inc(len(copies))
            return
        if len(self._tasks) >= self.max_inflight:
            self._dropped.inc(len(copies))
            return
        task = asyncio.create_task(self._mirror(list(copies)), name=f"{self.stage}-shadow")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _mirror(self, copies: list[ShadowCopy]) -> None:
        try:
            await self._serve(copies)
        except asyncio.CancelledError:
            self._dropped.inc(len(copies))
            raise

    async def _serve(self, copies: list[ShadowCopy]) -> None:
        checked: list[tuple[ShadowCopy, InferenceRequest]] = []
        for copy in copies:
            request = replace(copy.request, model_name=self.backend.model, model_version=self.backend.model_version)
            try:
                self.backend.check(request)
            except BadRequest:
                self._failed.inc()
                continue
            checked.append((copy, request))
        if not checked:
            return
        try:
            output = await self.backend.run([request for _, request in checked])
            records = [
                self._record(copy, outputs, output.model_name, output.model_version)
                for (copy, _), outputs in zip(checked, output.outputs, strict=True)
            ]
            assert self._send is not None
            await self._send(records)
        except Exception as exc:  # noqa: BLE001 - best effort: count it, never propagate
            log.debug("%s: shadow call failed: %s", self.stage, exc)
            self._failed.inc(len(checked))
            return
        self._sent.inc(len(records))

    def _record(self, copy: ShadowCopy, outputs: dict[str, np.ndarray], model: str, version: str) -> OutRecord:
        tensors, _ = self.tensor_map.from_model(copy.message, outputs)
        value, content_type = encode_response(
            copy.message, tensors, model_name=model, model_version=version, parameters=copy.message.parameters
        )
        headers = result_headers(
            list(copy.record.headers or ()),
            correlation_id=copy.request.correlation_id,
            stage=self.stage,
            model_name=model,
            model_version=version,
            content_type=content_type,
            route=SHADOW_ROUTE,
        )
        return OutRecord(
            topic=self.topic,
            key=copy.record.key,
            value=value,
            headers=headers,
            counts_as_result=False,
        )

    async def close(self) -> None:
        """Cancel what is still mirroring (counted dropped) and close the shadow's client."""
        for task in [*self._tasks, *([self._setup] if self._setup else [])]:
            task.cancel()
        await asyncio.gather(*self._tasks, *([self._setup] if self._setup else []), return_exceptions=True)
        await self.backend.close()
