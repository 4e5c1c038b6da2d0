"""The scalar types and the strict base every topology model shares.

Kept apart from :mod:`pipeline.topology.model` so that the sections defined in
their own modules (:mod:`pipeline.topology.routes`) build on the same names,
versions, topics and located errors without an import cycle.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, WithJsonSchema
from pydantic_core import PydanticCustomError

# --------------------------------------------------------------------------- scalar types

_NAME_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?")
_NAME_MAX = 64
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")
_TOPIC_MAX = 249  # Kafka's limit (topic directories are named <topic>-<partition>)
_VERSION_RE = re.compile(r"(?:[1-9][0-9]*)?")
_DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _check_name(value: str) -> str:
    if len(value) > _NAME_MAX or not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid name: use lowercase letters, digits and '-' "
            f"(not first or last), at most {_NAME_MAX} characters"
        )
    return value


def _check_topic(value: str) -> str:
    if len(value) > _TOPIC_MAX or not _TOPIC_RE.fullmatch(value) or value in (".", ".."):
        raise ValueError(
            f"{value!r} is not a valid Kafka topic name: use letters, digits, '.', '_' "
            f"and '-', at most {_TOPIC_MAX} characters"
        )
    return value


def _version_to_str(value: Any) -> Any:
    """``model_version: 3`` is what people type; store it as Triton's version string."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _check_version(value: str) -> str:
    if not _VERSION_RE.fullmatch(value):
        raise ValueError(f'{value!r} is not a model version: use "" (latest) or an integer >= 1')
    return value


def _duration_seconds(value: Any) -> Any:
    """``"90s"``, ``"3m"``, ``"500ms"``, ``"1h"`` -> seconds. A bare number is refused: a
    field named without its unit must carry it in the value, or ``3`` could mean anything."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a duration: give a number and a unit, ms, s, m or h (e.g. '90s', '3m')")
    match = _DURATION_RE.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not a duration: use a number and a unit, ms, s, m or h (e.g. '90s', '3m')")
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{value!r}: a duration must be longer than zero")
    return seconds


def _empty_to_none(value: Any) -> Any:
    """``"${TRITON_URL:-}"`` (quoted) gives ``""``; treat it like the unquoted form, null."""
    return None if value == "" else value


Name = Annotated[
    str,
    AfterValidator(_check_name),
    WithJsonSchema({"type": "string", "pattern": f"^{_NAME_RE.pattern}$", "maxLength": _NAME_MAX}),
]
"""A topology or stage name; it ends up in topic names and consumer group ids."""

TopicName = Annotated[
    str,
    AfterValidator(_check_topic),
    WithJsonSchema(
        {"type": "string", "pattern": f"^{_TOPIC_RE.pattern}$", "maxLength": _TOPIC_MAX}
    ),
]
"""A Kafka topic name."""

ModelVersion = Annotated[
    str,
    BeforeValidator(_version_to_str),
    AfterValidator(_check_version),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": f"^{_VERSION_RE.pattern}$"},
                {"type": "integer", "minimum": 1},
            ]
        }
    ),
]
"""``""`` for the latest version Triton serves, else a pinned version number."""

Duration = Annotated[
    float,
    BeforeValidator(_duration_seconds),
    WithJsonSchema({"type": "string", "pattern": f"^{_DURATION_RE.pattern}$"}),
]
"""A positive duration with its unit (``"90s"``, ``"3m"``, ``"500ms"``), held in seconds."""

Endpoint = Annotated[str | None, BeforeValidator(_empty_to_none)]
"""An optional ``host:port`` override; null or empty means "from the environment"."""

TensorMap = dict[str, str]


def _located(message: str, at: tuple[str | int, ...]) -> PydanticCustomError:
    """A validation error the loader reports at ``at`` (relative to the validator's own place)."""
    return PydanticCustomError("topology", message, {"at": at})


class _Strict(BaseModel):
    """Base of every topology model: unknown keys are errors, types are not coerced."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        use_attribute_docstrings=True,
        protected_namespaces=(),  # `model` and `model_version` are topology keys
    )
