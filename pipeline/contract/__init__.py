"""The message contract: how requests, results and dead letters travel as Kafka records.

See ``docs/message-contract.md`` for the contract itself; this package is its
only implementation, pure logic with no Kafka or Triton connection.
"""

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.records import (
    DeadLetter,
    Record,
    dead_letter_headers,
    read_dead_letter,
    result_headers,
)
from pipeline.contract.request import InferenceRequest, WireForm, decode_request, encode_request
from pipeline.contract.response import InferenceResponse, decode_response, encode_response
from pipeline.contract.validation import (
    DeclaredTensor,
    validate_inputs,
    validate_model,
    validate_outputs,
)

__all__ = [
    "BadRequest",
    "DeadLetter",
    "DeclaredTensor",
    "ErrorClass",
    "InferenceRequest",
    "InferenceResponse",
    "Record",
    "WireForm",
    "dead_letter_headers",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "read_dead_letter",
    "result_headers",
    "validate_inputs",
    "validate_model",
    "validate_outputs",
]
