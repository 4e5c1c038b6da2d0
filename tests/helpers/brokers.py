"""Which broker the test session runs on (``PIPELINE_TEST_BROKER``), for the session's stack
(tests/conftest.py) and for the tests that start brokers of their own to hurt them
(tests/helpers/own_broker.py)."""

from __future__ import annotations

import os

import pytest

from pipeline.embedded.stack import Broker

BROKER_SWITCH = "PIPELINE_TEST_BROKER"
"""Which embedded broker serves the session's stack: ``kafka`` (default: Apache Kafka, from the
jars scripts/install.sh --test resolves) or ``tansu``, the embedded stack's fallback where there
is no Java, which the suite also passes on (issue 25 item 5: the default since stop 26, after
the whole suite had passed on each). Tests that start brokers of their own choose them
themselves: Tansu where only it can stage the fault (``tansu_bootstrap`` in tests/conftest.py)."""


_BROKERS: dict[str, Broker] = {"tansu": "tansu", "kafka": "kafka"}


def session_broker() -> Broker:
    chosen = os.environ.get(BROKER_SWITCH, "kafka")
    if chosen not in _BROKERS:
        raise pytest.UsageError(f"{BROKER_SWITCH}={chosen!r}: expected 'tansu' or 'kafka'")
    return _BROKERS[chosen]
