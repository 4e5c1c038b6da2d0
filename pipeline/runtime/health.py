"""``/livez`` (and ``/healthz``), ``/readyz`` and ``/metrics`` for one worker process.

Served by aiohttp on the worker's event loop: every stage does its I/O
asynchronously (gRPC, Kafka) and its CPU work off the loop, so the endpoints
answer promptly even while batches run.

- ``/readyz`` (readiness: send work here?): 200 while every stage consumes and no
  partition's oldest unfinished record is older than its stage's ``stall_after_s``
  (:mod:`pipeline.runtime.watchdog`); else 503, one line per reason naming the
  stage and partition. It turns 200 again by itself once the work moves.
- ``/livez`` (liveness: restart me?), with ``/healthz`` as its alias: 200 unless a
  stage task died outside a shutdown; 503 naming it. A stuck event loop does not
  answer at all, so the probe's timeout fails it. A stall outside the process (a
  hung Triton) fails readiness only: restarting would not help.

The server binds :data:`DEFAULT_HOST` (loopback) unless told otherwise: metrics
name topics, models and stages, and nothing outside the machine should see them
by accident. Containers whose probes come from outside (Kubernetes) set
``--health-host 0.0.0.0`` (``PIPELINE_HEALTH_HOST``) on purpose.

The port is :data:`DEFAULT_PORT` unless the topology's ``http_port`` or
``--http-port`` says otherwise, so a Prometheus scrape configuration, a probe
or a Service can name it; 0 asks for any free port (tests, benchmarks, several
workers on one machine).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.errors import ConfigError
from pipeline.observability.metrics import PipelineMetrics

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9400
"""The health and metrics port: one stable number for scrape configurations and probes.
Clear of Triton (8000-8002), MinIO (9000/9001), Prometheus (9090), Kafka (9092),
Grafana (3000), OTLP (4317/4318) and the OpenTelemetry Prometheus exporter (9464)."""

Problems = Callable[[], list[str]]
"""Returns what is wrong (one line each); empty when all is well."""


def _nothing_wrong() -> list[str]:
    return []


class HealthServer:
    def __init__(
        self,
        metrics: PipelineMetrics,
        not_ready: Problems,
        host: str = DEFAULT_HOST,
        port: int = 0,
        *,
        not_live: Problems = _nothing_wrong,
        before_scrape: Callable[[], object] | None = None,
    ) -> None:
        self._metrics = metrics
        self._not_ready, self._not_live = not_ready, not_live
        self._before_scrape = before_scrape
        self._host, self._port = host, port  # the port asked for (0: any free one); self.port: the bound one
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/livez", self._livez)
        app.router.add_get("/healthz", self._livez)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:  # in use, or not an address of this host: one line, not a traceback
            await self._runner.cleanup()
            raise ConfigError(
                f"cannot serve /livez, /readyz and /metrics on {self._host}:{self._port}: {exc.strerror or exc}"
                " (choose another with --http-port, or 0 for any free port)"
            ) from exc
        sockets = getattr(site._server, "sockets", None)  # asyncio's or uvloop's Server
        assert sockets, "the health server has no listening socket"
        self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _livez(self, _request: web.Request) -> web.Response:
        return _answer(self._not_live(), "ok")

    async def _readyz(self, _request: web.Request) -> web.Response:
        return _answer(self._not_ready(), "ready")

    async def _metrics_handler(self, _request: web.Request) -> web.Response:
        if self._before_scrape is not None:
            self._before_scrape()
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _answer(problems: list[str], ok: str) -> web.Response:
    if not problems:
        return web.Response(text=f"{ok}\n")
    return web.Response(status=503, text="".join(f"{line}\n" for line in problems))
