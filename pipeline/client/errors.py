"""What a call through :class:`pipeline.client.Client` can raise, typed so callers can branch.

All are :class:`~pipeline.errors.PipelineError` (one line for a person). A timed-out
call's error is also an :class:`asyncio.TimeoutError`, so ``except asyncio.TimeoutError``
written for ``asyncio.wait_for`` keeps working.
"""

from __future__ import annotations

import asyncio

from pipeline.contract.records import DeadLetter
from pipeline.errors import PipelineError


class ClientError(PipelineError):
    """Base of every client error."""


class ClientClosed(ClientError):
    """The client was closed (or never started) while the call waited."""


class InferenceFailed(ClientError):
    """The pipeline answered the request with a dead letter instead of a result."""

    def __init__(self, correlation_id: str, dead_letter: DeadLetter, headers: dict[str, str]) -> None:
        self.correlation_id = correlation_id
        self.dead_letter = dead_letter
        self.error_class = dead_letter.error_class
        self.reason = dead_letter.reason
        self.stage = dead_letter.stage
        self.headers = headers
        super().__init__(f"request {correlation_id} failed at stage {self.stage!r}: {self.error_class}: {self.reason}")


class RequestDeadLettered(InferenceFailed):
    """The request is on the dead-letter topic (every failure is, today: the one kind of
    :class:`InferenceFailed`, named for where a replay tool finds it)."""


class RequestTimedOut(ClientError, asyncio.TimeoutError):
    """No outcome within the call's timeout. The request carried the matching ``deadline``
    header, so the pipeline dead-letters it (``deadline-exceeded``) if it is still
    waiting; a result arriving later is discarded by this client and counted."""

    def __init__(self, correlation_id: str, timeout_s: float) -> None:
        self.correlation_id = correlation_id
        self.timeout_s = timeout_s
        super().__init__(f"request {correlation_id}: no result within {timeout_s:g} s")
