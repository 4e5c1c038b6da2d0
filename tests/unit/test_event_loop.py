"""`pipeline run`'s event loop: uvloop by default, asyncio's own on request, a typo refused."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pipeline.errors import ConfigError
from pipeline.runtime.event_loop import EVENT_LOOP_ENV, chosen_event_loop, run_on_event_loop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_by_default_and_the_coroutine_runs_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    assert chosen_event_loop() == "uvloop"
    assert run_on_event_loop(_loop_module(), "uvloop").startswith("uvloop")


def test_asyncio_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, " AsyncIO ")
    assert chosen_event_loop() == "asyncio"
    assert run_on_event_loop(_loop_module(), "asyncio").startswith("asyncio")


def test_an_unknown_loop_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    with pytest.raises(ConfigError, match="PIPELINE_EVENT_LOOP='trio'"):
        chosen_event_loop()


def test_an_unretrieved_kafka_error_is_not_a_workers_last_line(caplog: pytest.LogCaptureFixture) -> None:
    """A delivery nobody awaits any more, collected after the stage reported its failure in one
    line, goes to the debug log; other unretrieved errors still reach asyncio's handler."""
    import gc

    from aiokafka.errors import RequestTimedOutError

    async def leave_failed_futures() -> None:
        loop = asyncio.get_running_loop()
        for error in (RequestTimedOutError(), ValueError("not kafka")):
            future = loop.create_future()
            future.set_exception(error)
            del future
        gc.collect()

    # The logger's own level: a test before this one in the same process may have run the CLI's
    # logging setup, which sets the `pipeline` loggers' level (INFO) and would hide the debug line.
    with caplog.at_level(logging.DEBUG, logger="pipeline.runtime.event_loop"):
        run_on_event_loop(leave_failed_futures(), "asyncio")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [str(r.exc_info[1]) if r.exc_info else r.getMessage() for r in errors] == ["not kafka"]
    assert any("unretrieved after the stage reported it" in r.getMessage() for r in caplog.records)
