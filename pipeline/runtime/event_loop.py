"""The event loop `pipeline run` serves on: uvloop unless ``PIPELINE_EVENT_LOOP=asyncio``.

Why uvloop: a stage is one CPU-bound event-loop thread, and uvloop's loop (libuv,
Cython) schedules callbacks and moves socket bytes for less CPU than asyncio's own.
Measured with ``benchmarks.stateless``, case (d) against case (u) (the same stage on
asyncio's loop) in the same run, nine runs (benchmarks/README.md, "Event loop"):
throughput median 1.17×, the stage's CPU per request median -15 %; no difference
beyond the noise on the audio path. asyncio's loop stays one variable away for
debugging (its debug mode, tools that expect it); where uvloop is not installed
(Windows), asyncio's is used.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from aiokafka.errors import KafkaError

from pipeline.errors import ConfigError

log = logging.getLogger(__name__)

EventLoopName = Literal["uvloop", "asyncio"]
EVENT_LOOP_ENV = "PIPELINE_EVENT_LOOP"
T = TypeVar("T")


def chosen_event_loop() -> EventLoopName:
    """The loop ``PIPELINE_EVENT_LOOP`` names (default uvloop), checked before anything starts."""
    name = os.environ.get(EVENT_LOOP_ENV, "uvloop").strip().lower()
    if name == "asyncio":
        return "asyncio"
    if name != "uvloop":
        raise ConfigError(f"{EVENT_LOOP_ENV}={name!r}: expected 'uvloop' or 'asyncio'")
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def run_on_event_loop(main: Coroutine[Any, Any, T], name: EventLoopName) -> T:
    """``asyncio.run(main)`` on the named loop, with :func:`quiet_unretrieved_kafka_errors`."""
    log.debug("event loop: %s", name)
    if name == "uvloop":
        import uvloop

        return uvloop.run(_quietly(main))
    return asyncio.run(_quietly(main))


async def _quietly(main: Coroutine[Any, Any, T]) -> T:
    asyncio.get_running_loop().set_exception_handler(quiet_unretrieved_kafka_errors)
    return await main


def quiet_unretrieved_kafka_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A delivery a stopping worker no longer waits for (the broker timed it out while the
    stage was failing) is collected with "Future exception was never retrieved" and a
    traceback, after the one line that reported the failure; that traceback became the
    worker's last line (CI, 2026-11-26, test_broker_unreachable_longer_than_the_send_timeout).
    Such Kafka errors were reported already: they go to the debug log. Everything else goes
    to asyncio's default handler.

    So do the failures of aiokafka's own background tasks that nobody awaits once their
    client is closing: its metadata task writing on a connection uvloop has closed raises
    ``RuntimeError: unable to perform operation on <TCPTransport closed=True ...>``, which
    became the last line after the one-line error (ci34, test_broker_kill_9_and_restart)."""
    exception = context.get("exception")
    unretrieved = "never retrieved" in str(context.get("message", ""))
    if unretrieved and (isinstance(exception, KafkaError) or _aiokafkas_own(context.get("future"))):
        log.debug("unretrieved after the stage reported it: %r", exception)
        return
    loop.default_exception_handler(context)


def _aiokafkas_own(future: object) -> bool:
    """Whether ``future`` is a task running one of aiokafka's own coroutines."""
    get_coro = getattr(future, "get_coro", None)
    code = getattr(get_coro() if get_coro is not None else None, "cr_code", None)
    return code is not None and f"{os.sep}aiokafka{os.sep}" in code.co_filename
