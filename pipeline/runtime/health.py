"""``/healthz``, ``/readyz`` and ``/metrics`` for one worker process.

Served by aiohttp on the worker's event loop: every stage does its I/O
asynchronously (gRPC, Kafka) and its CPU work off the loop, so the endpoints
answer promptly even while batches run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.observability.metrics import PipelineMetrics


class HealthServer:
    def __init__(
        self, metrics: PipelineMetrics, ready: Callable[[], bool], host: str = "0.0.0.0", port: int = 0
    ) -> None:
        self._metrics = metrics
        self._ready = ready
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server) and server.sockets
        self.port = int(server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _request: web.Request) -> web.Response:
        if self._ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def _metrics_handler(self, _request: web.Request) -> web.Response:
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
