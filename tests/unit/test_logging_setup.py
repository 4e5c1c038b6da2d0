"""The logging setup of `pipeline run`: our loggers follow --log-level, libraries stay at WARNING."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from pipeline.errors import ConfigError
from pipeline.observability.logging import LogSettings, configure_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in ("pipeline", "workers")})
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def _configured(level: str, fmt: str = "text") -> io.StringIO:
    stream = io.StringIO()
    configure_logging(LogSettings(level, fmt), stream)
    return stream


@pytest.mark.usefixtures("restore_logging")
def test_info_shows_ours_and_hides_library_info() -> None:
    stream = _configured("info")
    logging.getLogger("pipeline.runtime.runner").info("ours")
    logging.getLogger("aiokafka.consumer.group_coordinator").info("joined group")
    logging.getLogger("aiokafka.conn").warning("connection lost")
    text = stream.getvalue()
    assert "ours" in text and "connection lost" in text
    assert "joined group" not in text


@pytest.mark.usefixtures("restore_logging")
def test_debug_opens_the_libraries_and_error_closes_everything_below() -> None:
    stream = _configured("debug")
    logging.getLogger("aiokafka").debug("fetch")
    assert "fetch" in stream.getvalue()
    stream = _configured("error")
    logging.getLogger("pipeline").warning("ours")
    logging.getLogger("grpc").warning("theirs")
    assert stream.getvalue() == ""


@pytest.mark.usefixtures("restore_logging")
def test_json_lines_carry_level_logger_message_and_exception() -> None:
    stream = _configured("info", "json")
    log = logging.getLogger("workers.runtime.stream_stage")
    log.info("assigned %s", "p0", extra={"stage": "classify"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {k: first[k] for k in ("level", "logger", "message", "stage")} == {
        "level": "INFO", "logger": "workers.runtime.stream_stage", "message": "assigned p0", "stage": "classify"
    }
    assert first["timestamp"]
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]


@pytest.mark.parametrize(("level", "fmt"), [("verbose", "text"), ("info", "xml")])
def test_unknown_level_or_format_is_a_config_error(level: str, fmt: str) -> None:
    with pytest.raises(ConfigError):
        LogSettings(level, fmt)
