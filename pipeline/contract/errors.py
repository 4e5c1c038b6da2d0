"""Why a record could not be served, as a stable code.

Every record that cannot be turned into a result goes to the dead-letter topic
with an ``error-class`` header holding one of these codes. The codes are part of
the wire contract (dashboards and replay tools match on them), so values never
change meaning; new ones may be added.
"""

from __future__ import annotations

from enum import Enum

#: A reason is a header value read by people in consoles: one line, bounded.
MAX_REASON_CHARS = 500


class TextEnum(str, Enum):
    """A ``str`` enum whose ``str()`` is its value, written as-is into headers and output
    (what ``enum.StrEnum`` does from Python 3.11; we still support 3.10)."""

    def __str__(self) -> str:
        return str(self.value)


class ErrorClass(TextEnum):
    """Stable kebab-case codes for the ``error-class`` dead-letter header."""

    # The record itself.
    EMPTY_VALUE = "empty-value"
    OVERSIZED_VALUE = "oversized-value"
    MISSING_CONTENT_TYPE = "missing-content-type"
    UNSUPPORTED_CONTENT_TYPE = "unsupported-content-type"
    MALFORMED_REQUEST = "malformed-request"
    BAD_HEADER = "bad-header"
    MISSING_CORRELATION_ID = "missing-correlation-id"
    CONFLICTING_CORRELATION_ID = "conflicting-correlation-id"
    UNREADABLE_RECORD = "unreadable-record"  # the consumer cannot decode it (bad header key, CRC)
    # The tensors, alone or against the model's configuration.
    UNKNOWN_MODEL = "unknown-model"
    MODEL_VERSION_MISMATCH = "model-version-mismatch"
    UNKNOWN_INPUT = "unknown-input"
    MISSING_INPUT = "missing-input"
    DUPLICATE_INPUT = "duplicate-input"
    DATATYPE_MISMATCH = "datatype-mismatch"
    SHAPE_MISMATCH = "shape-mismatch"
    DATA_SIZE_MISMATCH = "data-size-mismatch"
    BATCH_TOO_LARGE = "batch-too-large"
    UNKNOWN_OUTPUT = "unknown-output"
    LENGTH_OUT_OF_RANGE = "length-out-of-range"
    """Longer than the stage's largest padding bucket (``padding.too_long: dead_letter``)."""
    UNKNOWN_TASK = "unknown-task"
    """A stage with route_by: task got no ``task`` header, or one naming none of its routes."""
    # Serving it.
    DEADLINE_EXCEEDED = "deadline-exceeded"
    INFERENCE_FAILED = "inference-failed"
    MODEL_UNAVAILABLE = "model-unavailable"
    UNENCODABLE_OUTPUT = "unencodable-output"
    RESULT_TOO_LARGE = "result-too-large"
    """A result larger than the producer's record limit: dead-lettered with a claim check."""
    QUOTA_EXCEEDED = "quota-exceeded"
    """Over its tenant's rate limit (policy dead-letter, or delayed ``max_delays`` times)."""
    # Keeping state.
    CORRUPT_STATE = "corrupt-state"


def one_line(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """Collapse whitespace (newlines included) and cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


class BadRequest(Exception):
    """A record the pipeline refuses, with the code and a one-line reason for people.

    The decoder raises only this, so a stage can catch exactly one type and
    dead-letter the record; any other exception escaping is a bug.
    """

    def __init__(self, error_class: ErrorClass, reason: str) -> None:
        self.error_class = ErrorClass(error_class)
        self.reason = one_line(reason)
        super().__init__(f"{self.error_class.value}: {self.reason}")
