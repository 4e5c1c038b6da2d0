"""A model description checks each request layout once (pipeline/contract/validation.py,
``AcceptedLayouts``): a repeated layout passes without a second check, a different one is
checked, a refused one is never remembered, and a new description starts over."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.contract import BadRequest, decode_request, encode_request
from pipeline.contract.request import InferenceRequest
from pipeline.contract.validation import AcceptedLayouts


def request(width: int, correlation_id: str = "c", **kwargs: object) -> InferenceRequest:
    record = encode_request({"x": np.zeros((1, width), dtype=np.float32)}, correlation_id=correlation_id, **kwargs)  # type: ignore[arg-type]
    return decode_request(record.value, list(record.headers))


def test_a_layout_is_remembered_per_description_and_only_once_accepted() -> None:
    accepted = AcceptedLayouts()
    first, second = object(), object()
    key = AcceptedLayouts.key(request(4))
    assert not accepted.holds(key, first)
    accepted.add(key, first)
    assert accepted.holds(AcceptedLayouts.key(request(4, "other id")), first), "same layout, new id and values"
    assert not accepted.holds(AcceptedLayouts.key(request(5)), first), "another shape"
    assert not accepted.holds(AcceptedLayouts.key(request(4, requested_outputs=["y"])), first), "other outputs"
    assert not accepted.holds(AcceptedLayouts.key(request(4, model_name="m")), first), "another model"
    assert not accepted.holds(key, second), "a reloaded model checks again"
    accepted.add(key, second)
    assert not accepted.holds(key, first)


def test_the_table_is_bounded() -> None:
    accepted = AcceptedLayouts(capacity=3)
    description = object()
    keys = [AcceptedLayouts.key(request(w)) for w in range(1, 6)]
    for key in keys:
        accepted.add(key, description)
    assert sum(accepted.holds(key, description) for key in keys) <= 3
    assert accepted.holds(keys[-1], description)


def test_a_refused_request_is_refused_every_time_by_the_backend() -> None:
    """The backend remembers a layout only after every check passed (TritonModelBackend.check)."""
    from workers.stateless.triton_backend import TritonModelBackend

    class Spec:
        def __init__(self, name: str, width: int) -> None:
            self.name, self.datatype, self.shape, self.optional = name, "FP32", [width], False

    class Description:
        max_batch_size = 8
        batching = True
        inputs = (Spec("x", 4),)
        outputs = (Spec("y", 2),)

    backend = TritonModelBackend.__new__(TritonModelBackend)
    backend.model, backend.model_version, backend.description = "", "", Description()  # type: ignore[assignment]
    backend._accepted = AcceptedLayouts()
    backend.check(request(4))
    backend.check(request(4, "again"))
    for _ in range(2):
        with pytest.raises(BadRequest, match="shape"):
            backend.check(request(5))
