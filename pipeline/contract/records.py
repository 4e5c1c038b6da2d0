"""Headers of the records a stage writes: results and dead letters.

Results carry every request header through, so tracing, routing and
application headers survive the pipeline without each stage knowing them.
Dead letters keep the original record byte for byte and only *append* the
``error-*`` headers, so a replay tool can re-produce the exact original.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.contract import headers as h
from pipeline.contract.errors import ErrorClass, one_line


@dataclass(frozen=True)
class Record:
    """A Kafka record to produce: aiokafka's ``send(topic, value, key=..., headers=...)`` arguments."""

    key: bytes | None
    value: bytes
    headers: h.Headers


@dataclass(frozen=True)
class DeadLetter:
    """What a dead-letter record says about its failure (the last ``error-*`` headers)."""

    stage: str
    error_class: str
    reason: str
    time_ms: int | None

    @property
    def known_class(self) -> ErrorClass | None:
        """The :class:`ErrorClass`, or ``None`` for a code this version does not know."""
        try:
            return ErrorClass(self.error_class)
        except ValueError:
            return None


_RESULT_OWNED = (h.CONTENT_TYPE, h.CORRELATION_ID, h.PIPELINE_STAGE, h.MODEL_NAME, h.MODEL_VERSION)


def result_headers(
    request_headers: h.HeaderPairs | None,
    *,
    correlation_id: str,
    stage: str,
    model_name: str,
    model_version: str,
    content_type: str,
) -> h.Headers:
    """The request's headers, minus those the result owns, plus the result's own.

    ``content-type`` is replaced by the result's; ``correlation-id`` is always
    set (it may have come only in the request body); ``pipeline-stage``,
    ``model-name`` and ``model-version`` say who produced the result. Owned
    names are appended at the end; all other headers keep their order and bytes.
    """
    return h.replace_headers(
        request_headers,
        [
            (h.CONTENT_TYPE, content_type),
            (h.CORRELATION_ID, correlation_id),
            (h.PIPELINE_STAGE, stage),
            (h.MODEL_NAME, model_name),
            (h.MODEL_VERSION, model_version),
        ],
    )


def dead_letter_headers(
    original_headers: h.HeaderPairs | None,
    *,
    stage: str,
    error_class: ErrorClass | str,
    reason: str,
    now_ms: int,
) -> h.Headers:
    """The original headers untouched, with ``error-stage/-class/-reason/-time`` appended.

    A record dead-lettered twice (replayed, failed again) carries both sets;
    readers take the last occurrence of each (see :func:`read_dead_letter`).
    """
    code = error_class.value if isinstance(error_class, ErrorClass) else str(error_class)
    kept: h.Headers = list(original_headers or [])  # type: ignore[arg-type]  # null values kept as is
    return kept + h.encode_headers(
        [
            (h.ERROR_STAGE, stage),
            (h.ERROR_CLASS, code),
            (h.ERROR_REASON, one_line(reason)),
            (h.ERROR_TIME, str(int(now_ms))),
        ]
    )


def read_dead_letter(headers: h.HeaderPairs | None) -> DeadLetter:
    """Read the failure a dead-letter record describes (last occurrence of each header wins)."""
    last: dict[str, str] = {}
    for key, value in headers or ():
        name = key.lower() if isinstance(key, str) else ""
        if (
            name in (h.ERROR_STAGE, h.ERROR_CLASS, h.ERROR_REASON, h.ERROR_TIME)
            and value is not None
        ):
            last[name] = bytes(value).decode("utf-8", errors="replace")
    time_text = last.get(h.ERROR_TIME, "")
    return DeadLetter(
        stage=last.get(h.ERROR_STAGE, ""),
        error_class=last.get(h.ERROR_CLASS, ""),
        reason=last.get(h.ERROR_REASON, ""),
        time_ms=int(time_text) if time_text.isascii() and time_text.isdigit() else None,
    )
