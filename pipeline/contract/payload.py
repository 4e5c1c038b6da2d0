"""The body of a request or response record, independent of its wire form.

The protobuf and JSON codecs both decode into a :class:`Payload`, so the
contract's rules that do not depend on the form (correlation IDs, sequence
parameters, header overrides) are written once, in :mod:`request`.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.contract.errors import BadRequest, ErrorClass

#: An OIP parameter value: what both ``InferParameter`` and JSON scalars can hold.
ParamValue = bool | int | float | str

#: Tensor parameters of transports we cannot carry over Kafka (Triton shared
#: memory, the HTTP binary-data extension). Refused rather than ignored, since
#: ignoring them would silently read the wrong data.
UNSUPPORTED_TENSOR_PARAMETERS = (
    "shared_memory_region",
    "shared_memory_byte_size",
    "shared_memory_offset",
    "binary_data_size",
)

#: Longest tensor, model or parameter name accepted (Triton has no limit; we want a bounded header/log line).
MAX_NAME_CHARS = 256


@dataclass(frozen=True, eq=False)
class ModelBody:
    """What a body, a decoded request and a decoded result all say besides their tensors:
    the model, its version and the tensors' datatypes."""

    model_name: str
    model_version: str
    datatypes: dict[str, str]

    def shared_fields(self) -> dict[str, Any]:
        """These fields by name, to build another body about the same model and tensors."""
        # Spelled out, not dataclasses.fields(): this runs once per decoded request.
        return {"model_name": self.model_name, "model_version": self.model_version, "datatypes": self.datatypes}


@dataclass(frozen=True, eq=False)
class Payload(ModelBody):
    """A decoded body: the ``id``, model, tensors (insertion-ordered) and parameters."""

    id: str
    tensors: dict[str, np.ndarray]
    requested_outputs: tuple[str, ...] = ()
    parameters: dict[str, ParamValue] = field(default_factory=dict)


def check_name(name: Any, what: str) -> str:
    """A tensor or model name: a non-empty string of bounded length."""
    if not isinstance(name, str) or not name:
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"{what} name must be a non-empty string")
    if len(name) > MAX_NAME_CHARS:
        raise BadRequest(
            ErrorClass.MALFORMED_REQUEST, f"{what} name is longer than {MAX_NAME_CHARS} characters"
        )
    return name


def ensure_new(name: str, seen: Container[str], *, duplicate: ErrorClass) -> None:
    """Refuse a second tensor of the same name (checked before its data is decoded)."""
    if name in seen:
        raise BadRequest(duplicate, f"tensor {name!r} appears more than once")


def reject_unsupported(tensor_parameters: Mapping[str, Any], name: str) -> None:
    """Refuse tensors that point at shared memory or out-of-band binary data."""
    for key in tensor_parameters:
        if key in UNSUPPORTED_TENSOR_PARAMETERS:
            raise BadRequest(
                ErrorClass.MALFORMED_REQUEST,
                f"{name}: parameter {key!r} is not supported over Kafka",
            )


def check_parameter_value(key: str, value: Any) -> ParamValue:
    """A request parameter value must be a JSON/protobuf scalar."""
    if isinstance(value, (bool, int, float, str)):
        return value
    raise BadRequest(
        ErrorClass.MALFORMED_REQUEST, f"parameter {key!r} must be a string, number or boolean"
    )
