"""Health and metrics listen on loopback unless told otherwise.

``/metrics`` names topics, stages and models; a worker that publishes it on every
interface by default tells anyone on the network how the service is built. The
proof uses a second loopback address: on Linux all of 127.0.0.0/8 reaches this
machine, so a server bound to 127.0.0.1 alone refuses 127.0.0.2, while one bound
to 0.0.0.0 answers it. No network interface beyond ``lo`` is needed.
"""

from __future__ import annotations

import aiohttp
import pytest

from pipeline.errors import ConfigError
from pipeline.observability.metrics import PipelineMetrics
from pipeline.runtime.health import DEFAULT_HOST, HealthServer


async def _status(host: str, port: int) -> int | None:
    """HTTP status of ``/livez`` at ``host:port``; None when the connection is refused."""
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://{host}:{port}/livez") as response:
            return response.status
    except aiohttp.ClientConnectorError:
        return None


async def test_default_bind_is_loopback_only() -> None:
    assert DEFAULT_HOST == "127.0.0.1"
    server = HealthServer(PipelineMetrics(), list)
    port = await server.start()
    try:
        assert await _status("127.0.0.1", port) == 200
        assert await _status("127.0.0.2", port) is None
    finally:
        await server.stop()


async def test_an_explicit_host_is_honoured() -> None:
    server = HealthServer(PipelineMetrics(), list, host="0.0.0.0")
    port = await server.start()
    try:
        assert await _status("127.0.0.2", port) == 200
    finally:
        await server.stop()


async def test_a_port_in_use_is_one_line_naming_it() -> None:
    """A supervisor's child restarted onto a port something else took meanwhile (an outgoing
    connection's ephemeral port) must say so in one line, not with a traceback."""
    first = HealthServer(PipelineMetrics(), list)
    port = await first.start()
    try:
        second = HealthServer(PipelineMetrics(), list, port=port)
        with pytest.raises(ConfigError, match=rf"cannot serve .* on 127\.0\.0\.1:{port}: .*in use"):
            await second.start()
    finally:
        await first.stop()
