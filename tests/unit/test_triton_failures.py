"""The one classifier of Triton inference errors: outage, transient, or the request's fault.

The messages are Triton 2.51's own (observed in tests/integration/test_model_lifecycle.py
and test_triton_faults.py); the client is a stand-in answering only the two probes the
classifier makes (repository index and server readiness), so each rule is checked alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from tritonclient.utils import InferenceServerException

from pipeline.contract.errors import ErrorClass
from pipeline.failure_policy import FailureKind
from pipeline.triton.failures import TritonFailureClassifier

UNLOADED = InferenceServerException(
    "Request for unknown model: 'dense_classifier' has no available versions", status="StatusCode.NOT_FOUND"
)
PINNED_UNLOADED = InferenceServerException(
    "Request for unknown model: 'dense_classifier' version 1 is not at ready state", status="StatusCode.UNAVAILABLE"
)


@dataclass
class _Entry:
    name: str
    version: str
    state: str


@dataclass
class _Index:
    models: list[_Entry]


@dataclass
class _Probes:
    """Answers ``get_model_repository_index`` and ``is_server_ready`` as told; None = fails."""

    states: dict[str, str] | None = field(default_factory=dict)  # version -> state of dense_classifier
    ready: bool | None = True

    async def get_model_repository_index(self, client_timeout: float) -> _Index:
        if self.states is None:
            raise InferenceServerException("failed to connect to all addresses", status="StatusCode.UNAVAILABLE")
        return _Index([_Entry("dense_classifier", v, s) for v, s in self.states.items()] + [_Entry("other", "1", "READY")])

    async def is_server_ready(self, client_timeout: float) -> bool:
        if self.ready is None:
            raise InferenceServerException("Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED")
        return self.ready


def _classifier(probes: _Probes, version: str = "") -> TritonFailureClassifier:
    return TritonFailureClassifier(cast(Any, probes), "dense_classifier", version)


@pytest.mark.parametrize("state", ["UNAVAILABLE", "UNLOADING", "LOADING"])
@pytest.mark.parametrize("error", [UNLOADED, PINNED_UNLOADED], ids=["latest", "pinned"])
async def test_the_stages_model_not_loaded_is_an_outage_whatever_its_index_state(
    state: str, error: InferenceServerException
) -> None:
    """Unloaded by a person, failed to load, or being (re)loaded: no request of the stage
    can succeed until it is back, so they wait instead of being dead-lettered."""
    failure = await _classifier(_Probes(states={"1": state})).classify(error)
    assert failure.kind is FailureKind.OUTAGE
    assert failure.error_class is ErrorClass.MODEL_UNAVAILABLE


async def test_a_model_gone_from_the_repository_or_an_unreadable_index_is_an_outage() -> None:
    assert (await _classifier(_Probes(states={})).classify(UNLOADED)).kind is FailureKind.OUTAGE
    assert (await _classifier(_Probes(states=None)).classify(UNLOADED)).kind is FailureKind.OUTAGE


async def test_not_loaded_while_the_index_says_ready_is_transient() -> None:
    """It became ready meanwhile, or the request named a version that is not the one
    serving: retried a bounded number of times, so such a request cannot wait forever."""
    failure = await _classifier(_Probes(states={"1": "UNAVAILABLE", "2": "READY"})).classify(PINNED_UNLOADED)
    assert failure.kind is FailureKind.TRANSIENT
    pinned = await _classifier(_Probes(states={"1": "UNAVAILABLE", "2": "READY"}), version="1").classify(PINNED_UNLOADED)
    assert pinned.kind is FailureKind.OUTAGE, "a pinned stage looks at its own version only"


async def test_a_version_the_request_names_that_triton_does_not_have_is_the_requests_fault() -> None:
    """An unpinned stage passes a request's own version on; one that does not exist is
    dead-lettered at once (message observed on Triton 2.51)."""
    error = InferenceServerException(
        "Request for unknown model: 'dense_classifier' version 99 is not found", status="StatusCode.NOT_FOUND"
    )
    failure = await _classifier(_Probes(states={"1": "READY"})).classify(error)
    assert (failure.kind, failure.error_class) == (FailureKind.PERMANENT, ErrorClass.UNKNOWN_MODEL)


@pytest.mark.parametrize(
    ("error", "ready", "kind"),
    [
        (InferenceServerException("failed to connect to all addresses", status="StatusCode.UNAVAILABLE"), True, FailureKind.OUTAGE),
        (InferenceServerException("Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED"), None, FailureKind.OUTAGE),
        (InferenceServerException("Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED"), True, FailureKind.TRANSIENT),
        (InferenceServerException("", status="StatusCode.CANCELLED"), True, FailureKind.TRANSIENT),
        (InferenceServerException("exceeds maximum queue size", status="StatusCode.UNAVAILABLE"), True, FailureKind.OUTAGE),
        (InferenceServerException("unexpected shape for input", status="StatusCode.INVALID_ARGUMENT"), True, FailureKind.PERMANENT),
        (InferenceServerException("unexpected shape for input", status="StatusCode.INVALID_ARGUMENT"), False, FailureKind.OUTAGE),
        (ValueError("not from Triton"), True, FailureKind.PERMANENT),
    ],
    ids=["refused", "hung", "slow", "cancelled", "queue-full", "bad-request", "bad-while-not-ready", "other"],
)
async def test_the_other_rules(error: BaseException, ready: bool | None, kind: FailureKind) -> None:
    assert (await _classifier(_Probes(ready=ready)).classify(error)).kind is kind
