"""A batching backend over several Triton models: one :class:`TritonModelBackend` per route.

The stage calls :meth:`RoutedBackend.assign` on each decoded request: the route
table picks the route (by key and weight, or by task header) and the request is
re-addressed to that route's model and version. Everything after that is the
route's own backend (checks against its model's metadata, rows, its batch key
prefixed by the model, so a batch never mixes routes), and its result names the
route (``pipeline-route`` header). A request that named a model itself is routed
all the same: in a stage with routes the stage chooses the model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Sequence
from dataclasses import replace

from pipeline.contract.request import InferenceRequest
from pipeline.failure_policy import Failure
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.tracing import CallSpan
from pipeline.observability.traffic_metrics import TrafficMetrics
from pipeline.settings import TritonSettings
from pipeline.triton.client import triton_call_span
from workers.stateless.backend import BatchOutput
from workers.stateless.routes import Route, RouteTable
from workers.stateless.triton_backend import TritonModelBackend


class RouteCallFailed(Exception):
    """A route's call failed; carries the route so its own backend classifies the cause."""

    def __init__(self, route: str, cause: BaseException) -> None:
        super().__init__(f"route {route}: {cause}")
        self.route = route
        self.cause = cause


class RoutedBackend:
    """Serve each batch with the backend of the route its requests were assigned to."""

    device: str | None = None

    def __init__(
        self,
        settings: TritonSettings,
        table: RouteTable,
        *,
        stage: str,
        metrics: TrafficMetrics,
        call_timeout_s: float = 30.0,
    ) -> None:
        self.table = table
        self.name = ",".join(route.model for route in table.routes)
        self.call_span: CallSpan = triton_call_span(settings, self.name)
        self._backends = {
            route.name: TritonModelBackend(settings, route.model, route.model_version, call_timeout_s=call_timeout_s)
            for route in table.routes
        }
        self._by_target = {(route.model, route.model_version): route for route in table.routes}
        self._requests = {route.name: metrics.route_requests.labels(stage, route.name) for route in table.routes}
        self._latency = {route.name: metrics.route_latency.labels(stage, route.name) for route in table.routes}

    def assign(self, record: ConsumedRecord, request: InferenceRequest) -> InferenceRequest:
        """Choose the record's route; raises ``BadRequest`` (unknown-task) when it has none."""
        route = self.table.pick(record.key, request.correlation_id, record.headers)
        self._requests[route.name].inc()
        return replace(request, model_name=route.model, model_version=route.model_version)

    def route_of(self, request: InferenceRequest) -> Route:
        return self._by_target[(request.model_name, request.model_version)]

    def _backend(self, request: InferenceRequest) -> TritonModelBackend:
        return self._backends[self.route_of(request).name]

    # ------------------------------------------------------------------ BatchBackend
    async def setup(self) -> int:
        """Set every route up; the row limit is the smallest any route's model allows."""
        limits = await asyncio.gather(*(backend.setup() for backend in self._backends.values()))
        return min((limit for limit in limits if limit), default=0)

    async def close(self) -> None:
        await asyncio.gather(*(backend.close() for backend in self._backends.values()), return_exceptions=True)

    async def warmup(self) -> None:
        await asyncio.gather(*(backend.warmup() for backend in self._backends.values()))

    def check(self, request: InferenceRequest) -> object:
        self._backend(request).check(request)
        return None

    def rows(self, request: InferenceRequest) -> int:
        return self._backend(request).rows(request)

    def batch_key(self, request: InferenceRequest) -> Hashable:
        return (request.model_name, request.model_version, self._backend(request).batch_key(request))

    async def run(self, requests: Sequence[InferenceRequest], prepared: Sequence[object]) -> BatchOutput:
        route = self.route_of(requests[0])
        started = time.perf_counter()
        try:
            output = await self._backends[route.name].run(requests, prepared)
        except Exception as exc:
            raise RouteCallFailed(route.name, exc) from exc
        self._latency[route.name].observe(time.perf_counter() - started)
        return replace(output, route=route.name)

    async def classify(self, exc: BaseException) -> Failure:
        if isinstance(exc, RouteCallFailed):
            return await self._backends[exc.route].classify(exc.cause)
        return await next(iter(self._backends.values())).classify(exc)
