"""`pipeline run`'s event loop: uvloop by default, asyncio's own on request, a typo refused."""

from __future__ import annotations

import asyncio

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
