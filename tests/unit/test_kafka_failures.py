"""A stage that Kafka fails stops with one line for the operator, not a traceback.

Why: an output the broker never acknowledges within the send timeout stops the stage
(nothing past it is committed; a restarted worker replays). That is an outage to report,
and the CLI prints a :class:`PipelineError` as one line: so the Kafka error is turned
into one, naming the stage, and anything else still surfaces as the bug it is.
"""

from __future__ import annotations

import pytest
from aiokafka.errors import RequestTimedOutError

from pipeline.errors import EndpointUnreachable
from pipeline.kafka.clients import failing_in_one_line


async def _raise(exc: Exception) -> None:
    raise exc


async def test_a_kafka_error_becomes_one_line_naming_the_stage() -> None:
    with pytest.raises(EndpointUnreachable) as caught:
        await failing_in_one_line(_raise(RequestTimedOutError()), "stage classify")
    message = str(caught.value)
    assert message.startswith("stage classify: Kafka failed it (RequestTimedOutError")
    assert "\n" not in message and "replays" in message
    assert isinstance(caught.value.__cause__, RequestTimedOutError)


async def test_other_errors_keep_their_type() -> None:
    with pytest.raises(ZeroDivisionError):
        await failing_in_one_line(_raise(ZeroDivisionError()), "stage classify")


def test_a_create_topics_answer_is_read_topic_by_topic(caplog: pytest.LogCaptureFixture) -> None:
    """aiokafka does not raise on a topic's own error in a CreateTopics answer: a least-privilege
    user (``deploy k8s --strimzi-users``) was refused every topic it may not describe, and the
    worker logged them all as created. Only those with error 0 are created."""
    from types import SimpleNamespace

    from pipeline.kafka.clients import _created

    answer = SimpleNamespace(
        topic_errors=[("made", 0, None), ("raced", 36, "exists"), ("not-mine", 29, "denied"), ("odd", 42, "invalid")]
    )
    with caplog.at_level("WARNING", logger="pipeline.kafka.clients"):
        assert _created(answer, ["made", "raced", "not-mine", "odd"]) == ["made"]
    assert "not-mine" in caplog.text and "error 42" in caplog.text and "raced" not in caplog.text
