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
    route: str | None = None,
) -> h.Headers:
    """The request's headers, minus those the result owns, plus the result's own.

    ``content-type`` is replaced by the result's; ``correlation-id`` is always
    set (it may have come only in the request body); ``pipeline-stage``,
    ``model-name`` and ``model-version`` say who produced the result (``pipeline-route``
    too, when the stage has routes or a shadow). Owned
    names are appended at the end; all other headers keep their order and bytes.
    """
    owned = ResultHeaders(stage=stage, model_name=model_name, model_version=model_version, content_type=content_type, route=route)
    return owned.of(request_headers, correlation_id)


class ResultHeaders:
    """:func:`result_headers` for the results of one batch (one stage, model, version and
    content type): the headers they share are encoded once, only each request's own
    headers and correlation ID per result."""

    def __init__(
        self, *, stage: str, model_name: str, model_version: str, content_type: str, route: str | None = None
    ) -> None:
        route_pair = [(h.PIPELINE_ROUTE, route)] if route is not None else []
        self._drop = {name.lower() for name in (*_RESULT_OWNED, *(name for name, _ in route_pair))}
        self._before = h.encode_headers([(h.CONTENT_TYPE, content_type)])
        self._after = h.encode_headers(
            [(h.PIPELINE_STAGE, stage), (h.MODEL_NAME, model_name), (h.MODEL_VERSION, model_version), *route_pair]
        )

    def of(self, request_headers: h.HeaderPairs | None, correlation_id: str) -> h.Headers:
        drop = self._drop
        kept: h.Headers = [(k, v) for k, v in request_headers or () if not (isinstance(k, str) and k.lower() in drop)]  # type: ignore[misc]
        return kept + self._before + [(h.CORRELATION_ID, correlation_id.encode("utf-8"))] + self._after


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


#: Where an unreadable record sits (its dead letter carries no trustworthy original headers).
SOURCE_TOPIC = "source-topic"
SOURCE_PARTITION = "source-partition"
SOURCE_OFFSET = "source-offset"


def source_position_headers(topic: str, partition: int, offset: int) -> h.Headers:
    """``source-topic/-partition/-offset``: a dead letter found by position, not by content."""
    return h.encode_headers(
        [(SOURCE_TOPIC, topic), (SOURCE_PARTITION, str(partition)), (SOURCE_OFFSET, str(offset))]
    )


def read_dead_letter(headers: h.HeaderPairs | None) -> DeadLetter:
    """Read the failure a dead-letter record describes (last occurrence of each header wins)."""
    last = _last_values(headers, (h.ERROR_STAGE, h.ERROR_CLASS, h.ERROR_REASON, h.ERROR_TIME))
    return DeadLetter(
        stage=last.get(h.ERROR_STAGE, ""),
        error_class=last.get(h.ERROR_CLASS, ""),
        reason=last.get(h.ERROR_REASON, ""),
        time_ms=_int_or_none(last.get(h.ERROR_TIME)),
    )


def _last_values(headers: h.HeaderPairs | None, names: tuple[str, ...]) -> dict[str, str]:
    """The UTF-8 text (invalid bytes replaced) of the last occurrence of each of ``names``."""
    last: dict[str, str] = {}
    for key, value in headers or ():
        name = key.lower() if isinstance(key, str) else ""
        if name in names and value is not None:
            last[name] = bytes(value).decode("utf-8", errors="replace")
    return last


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isascii() and text.isdigit() else None


# Claim checks: a dead letter too large for the dead-letter topic keeps its payload in
# the S3 store and carries these headers instead (docs/message-contract.md, "Sizes and
# claim checks"). They are appended after the ``error-*`` headers.
CLAIM_CHECK_STATUS = "claim-check-status"
CLAIM_CHECK_URI = "claim-check-uri"
CLAIM_CHECK_SIZE = "claim-check-size"
CLAIM_CHECK_SHA256 = "claim-check-sha256"
CLAIM_CHECK_ERROR = "claim-check-error"
CLAIM_CHECK_HEADERS = (CLAIM_CHECK_STATUS, CLAIM_CHECK_URI, CLAIM_CHECK_SIZE, CLAIM_CHECK_SHA256, CLAIM_CHECK_ERROR)
STORED = "stored"
NOT_KEPT = "not-kept"


@dataclass(frozen=True)
class ClaimCheck:
    """Where a dead letter's payload went: ``uri`` in the S3 store, or nowhere (``error``)."""

    size: int
    sha256: str
    uri: str | None = None
    error: str | None = None

    @property
    def stored(self) -> bool:
        return self.uri is not None


def claim_check_headers(headers: h.HeaderPairs | None, check: ClaimCheck) -> h.Headers:
    """``headers`` with the claim-check headers appended: status ``stored`` with the
    payload's ``s3://`` URI, or ``not-kept`` with the reason; size and SHA-256 always."""
    pairs = [(CLAIM_CHECK_STATUS, STORED if check.stored else NOT_KEPT)]
    if check.uri is not None:
        pairs.append((CLAIM_CHECK_URI, check.uri))
    pairs += [(CLAIM_CHECK_SIZE, str(check.size)), (CLAIM_CHECK_SHA256, check.sha256)]
    if check.error is not None:
        pairs.append((CLAIM_CHECK_ERROR, one_line(check.error)))
    kept: h.Headers = list(headers or [])  # type: ignore[arg-type]  # null values kept as is
    return kept + h.encode_headers(pairs)


def read_claim_check(headers: h.HeaderPairs | None) -> ClaimCheck | None:
    """The claim check a dead-letter record carries (last occurrence wins), or None."""
    last = _last_values(headers, CLAIM_CHECK_HEADERS)
    if CLAIM_CHECK_STATUS not in last:
        return None
    size = last.get(CLAIM_CHECK_SIZE, "")
    return ClaimCheck(
        size=int(size) if size.isascii() and size.isdigit() else -1,
        sha256=last.get(CLAIM_CHECK_SHA256, ""),
        uri=last.get(CLAIM_CHECK_URI) if last[CLAIM_CHECK_STATUS] == STORED else None,
        error=last.get(CLAIM_CHECK_ERROR),
    )


#: The dead-letter bookkeeping a replay removes: what failed, where the record was, its claim check.
DEAD_LETTER_HEADERS = (
    h.ERROR_STAGE, h.ERROR_CLASS, h.ERROR_REASON, h.ERROR_TIME,
    SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, *CLAIM_CHECK_HEADERS,
)
#: How many times a record has been replayed from a dead-letter topic (absent: never).
REPLAY_COUNT = "replay-count"


def replay_headers(headers: h.HeaderPairs | None) -> h.Headers:
    """A dead letter's headers minus every ``error-*``, ``source-*`` and claim-check
    header: the original record's headers, for re-producing it."""
    return h.without(headers, DEAD_LETTER_HEADERS)


@dataclass(frozen=True)
class SourcePosition:
    """Where the record a dead letter stands for was consumed."""

    topic: str
    partition: int | None
    offset: int | None


def read_source(headers: h.HeaderPairs | None) -> SourcePosition | None:
    """The ``source-topic/-partition/-offset`` a dead letter carries (last occurrence wins),
    or None: dead letters written before these headers existed, join expiries and
    ``result-too-large`` claim checks have none."""
    last = _last_values(headers, (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET))
    if not last.get(SOURCE_TOPIC):
        return None
    return SourcePosition(
        last[SOURCE_TOPIC], _int_or_none(last.get(SOURCE_PARTITION)), _int_or_none(last.get(SOURCE_OFFSET))
    )


def read_replay_count(headers: h.HeaderPairs | None) -> int:
    """The record's ``replay-count`` (last occurrence; 0 when absent or not a number)."""
    return _int_or_none(_last_values(headers, (REPLAY_COUNT,)).get(REPLAY_COUNT)) or 0


def replayed_headers(headers: h.HeaderPairs | None, count: int) -> h.Headers:
    """What a replayed record carries: the original headers, bytes and order kept, the
    dead-letter bookkeeping removed, ``replay-count: count`` appended (replacing the old one)."""
    return h.replace_headers(replay_headers(headers), [(REPLAY_COUNT, str(count))])
