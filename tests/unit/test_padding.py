"""Length-aware batching, offline: the ``padding:`` section (located errors), its checks
against a model's metadata (``pipeline validate``), padding/trimming, the element bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.request import InferenceRequest
from pipeline.errors import ConfigError
from pipeline.topology import load_topology, parse_topology
from pipeline.topology.compat import check_compatibility
from pipeline.topology.model import StatelessStageConfig
from pipeline.topology.padding import PaddingConfig
from tests.helpers.fake_triton import FakeModel, FakeTensor, FakeTriton
from workers.stateless.batching import DynamicBatcher
from workers.stateless.padding import Padder

REPO_ROOT = Path(__file__).resolve().parents[2]

TOKEN_POOL = FakeModel(
    [FakeTensor("tokens", "FP32", (-1,)), FakeTensor("lengths", "INT32", (1,))],
    [FakeTensor("pooled", "FP32", (4,)), FakeTensor("per_token", "FP32", (-1,))],
)

PADDED = """\
name: demo
input_topic: requests
result_topic: results
stages:
  - name: pool
    kind: stateless
    model: token_pool
    padding:
      input: tokens
      buckets: [16, 32, 64]
      lengths_input: lengths
      trim_outputs: [per_token]
"""


def _load_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_topology(path, environ={})
    message = str(caught.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------- the section


def test_the_example_topology_loads() -> None:
    topology = load_topology(REPO_ROOT / "topologies" / "padded.yaml", environ={})
    [stage] = topology.stages
    assert isinstance(stage, StatelessStageConfig) and stage.padding is not None
    assert stage.padding.buckets == [16, 32, 64, 128]
    assert (stage.padding.input, stage.padding.lengths_input) == ("tokens", "lengths")
    assert check_compatibility(topology, FakeTriton({"token_pool": TOKEN_POOL}).describe) == []


def test_buckets_not_strictly_increasing_is_located(tmp_path: Path) -> None:
    text = PADDED.replace("[16, 32, 64]", "[16, 32, 32]")
    assert _load_error(tmp_path, text) == (
        f"{tmp_path / 't.yaml'}:10: stages[0].padding.buckets[2]: buckets must be strictly increasing: 32 follows 32"
    )


def test_a_bucket_that_is_not_positive_is_located(tmp_path: Path) -> None:
    message = _load_error(tmp_path, PADDED.replace("[16, 32, 64]", "[0, 32, 64]"))
    assert message.startswith(f"{tmp_path / 't.yaml'}:10: stages[0].padding.buckets[0]: ")
    assert "greater than 0" in message


def test_no_buckets_is_an_error(tmp_path: Path) -> None:
    message = _load_error(tmp_path, PADDED.replace("[16, 32, 64]", "[]"))
    assert message.startswith(f"{tmp_path / 't.yaml'}:10: stages[0].padding.buckets: ")


def test_lengths_and_mask_together_are_refused(tmp_path: Path) -> None:
    text = PADDED.replace("      lengths_input: lengths\n", "      lengths_input: lengths\n      mask_input: mask\n")
    assert _load_error(tmp_path, text) == (
        f"{tmp_path / 't.yaml'}:12: stages[0].padding.mask_input: give lengths_input or mask_input, not both"
    )


def test_an_unknown_padding_key_is_located(tmp_path: Path) -> None:
    message = _load_error(tmp_path, PADDED.replace("      buckets:", "      bukets: [1]\n      buckets:"))
    assert message.startswith(f"{tmp_path / 't.yaml'}:10: stages[0].padding.bukets: ")


def test_bucket_choice() -> None:
    config = PaddingConfig(input="t", buckets=[16, 32])
    assert [config.bucket(n) for n in (0, 1, 16, 17, 32, 33)] == [16, 16, 16, 32, 32, None]


# ------------------------------------------------------------------- against the model


def _problems(model: FakeModel, text: str = PADDED) -> list[str]:
    return check_compatibility(parse_topology(text), FakeTriton({"token_pool": model}).describe)


def test_padded_input_missing() -> None:
    assert _problems(TOKEN_POOL, PADDED.replace("input: tokens", "input: tokenz")) == [
        "stage 'pool': padding.input 'tokenz' is not an input of model 'token_pool' (its inputs: tokens, lengths)"
    ]


def test_padded_input_without_a_variable_dim() -> None:
    fixed = FakeModel([FakeTensor("tokens", "FP32", (8,)), TOKEN_POOL.inputs[1]], TOKEN_POOL.outputs)
    assert _problems(fixed) == [
        "stage 'pool': padding.input 'tokens' has shape [8] in model 'token_pool': no variable (-1) dim; "
        "padding needs exactly one, the length"
    ]


def test_lengths_input_missing_or_of_the_wrong_type() -> None:
    without = FakeModel([TOKEN_POOL.inputs[0]], TOKEN_POOL.outputs)
    assert _problems(without) == [
        "stage 'pool': padding.lengths_input 'lengths' is not an input of model 'token_pool' (its inputs: tokens)"
    ]
    floats = FakeModel([TOKEN_POOL.inputs[0], FakeTensor("lengths", "FP32", (1,))], TOKEN_POOL.outputs)
    assert _problems(floats) == [
        "stage 'pool': padding.lengths_input 'lengths' is FP32 [1] in model 'token_pool'; it must be INT32 or INT64 [1]"
    ]
    wide = FakeModel([TOKEN_POOL.inputs[0], FakeTensor("lengths", "INT64", (2,))], TOKEN_POOL.outputs)
    assert _problems(wide) == [
        "stage 'pool': padding.lengths_input 'lengths' is INT64 [2] in model 'token_pool'; it must be INT32 or INT64 [1]"
    ]


def test_mask_input_missing_or_of_the_wrong_shape() -> None:
    text = PADDED.replace("lengths_input: lengths", "mask_input: mask")
    masked = FakeModel([TOKEN_POOL.inputs[0], FakeTensor("mask", "INT32", (-1,))], TOKEN_POOL.outputs)
    assert _problems(masked, text) == []
    assert _problems(TOKEN_POOL, text) == [
        "stage 'pool': padding.mask_input 'mask' is not an input of model 'token_pool' (its inputs: tokens, lengths)"
    ]
    scalar = FakeModel([TOKEN_POOL.inputs[0], FakeTensor("mask", "BYTES", (1,))], TOKEN_POOL.outputs)
    assert _problems(scalar, text) == [
        "stage 'pool': padding.mask_input 'mask' is BYTES [1] in model 'token_pool'; it must have 'tokens''s shape "
        "[-1] and one of BOOL, INT8, INT32, INT64, FP16, FP32"
    ]


def test_trim_output_unknown_or_without_a_variable_dim() -> None:
    assert _problems(TOKEN_POOL, PADDED.replace("[per_token]", "[per_tokn]")) == [
        "stage 'pool': padding.trim_outputs 'per_tokn' is not an output of model 'token_pool' "
        "(its outputs: pooled, per_token)"
    ]
    assert _problems(TOKEN_POOL, PADDED.replace("[per_token]", "[pooled]")) == [
        "stage 'pool': padding.trim_outputs 'pooled' has shape [4] in model 'token_pool': no variable (-1) dim to trim"
    ]


# ------------------------------------------------------------------- padding, trimming


def _padder(**changes: object) -> Padder:
    config = PaddingConfig.model_validate(
        {"input": "tokens", "buckets": [4, 8], "lengths_input": "lengths", "trim_outputs": ["per_token"], **changes}
    )
    padder = Padder(config, "pool", "token_pool", lambda: TOKEN_POOL)
    padder.bind()
    return padder


def _request(tokens: np.ndarray, **extra: np.ndarray) -> InferenceRequest:
    inputs = {"tokens": tokens, **extra}
    return InferenceRequest(
        model_name="token_pool",
        model_version="",
        datatypes={name: "FP32" if name == "tokens" else "INT32" for name in inputs},
        correlation_id="c",
        inputs=inputs,
    )


def test_pads_to_the_bucket_and_fills_lengths() -> None:
    padded = _padder(pad_value=-1.0).pad(_request(np.ones((2, 3), np.float32)))
    assert padded.length == 3 and padded.elements == 8
    np.testing.assert_array_equal(padded.request.inputs["tokens"], [[1, 1, 1, -1]] * 2)
    assert padded.request.inputs["tokens"].dtype == np.float32
    np.testing.assert_array_equal(padded.request.inputs["lengths"], [[3], [3]])
    assert padded.request.inputs["lengths"].dtype == np.int32
    assert padded.request.datatypes["lengths"] == "INT32"


def test_fills_a_mask_instead() -> None:
    model = FakeModel([TOKEN_POOL.inputs[0], FakeTensor("mask", "INT64", (-1,))], TOKEN_POOL.outputs)
    config = PaddingConfig(input="tokens", buckets=[4], mask_input="mask")
    padder = Padder(config, "pool", "token_pool", lambda: model)
    padder.bind()
    padded = padder.pad(_request(np.ones((1, 2), np.float32)))
    np.testing.assert_array_equal(padded.request.inputs["mask"], [[1, 1, 0, 0]])
    assert padded.request.inputs["mask"].dtype == np.int64


def test_trims_per_position_outputs_only() -> None:
    outputs = {"per_token": np.arange(8, dtype=np.float32).reshape(2, 4), "pooled": np.zeros((2, 4), np.float32)}
    trimmed = _padder().trim(outputs, 3)
    np.testing.assert_array_equal(trimmed["per_token"], [[0, 1, 2], [4, 5, 6]])
    assert trimmed["pooled"].shape == (2, 4)


def test_too_long_is_a_dead_letter_or_goes_exact() -> None:
    with pytest.raises(BadRequest) as caught:
        _padder().pad(_request(np.ones((1, 9), np.float32)))
    assert caught.value.error_class is ErrorClass.LENGTH_OUT_OF_RANGE
    assert caught.value.reason == "input 'tokens' has length 9, longer than the largest padding bucket 8"
    exact = _padder(too_long="exact").pad(_request(np.ones((1, 9), np.float32)))
    assert exact.request.inputs["tokens"].shape == (1, 9) and exact.length == 9


def test_a_request_sending_the_lengths_itself_is_refused() -> None:
    with pytest.raises(BadRequest) as caught:
        _padder().pad(_request(np.ones((1, 2), np.float32), lengths=np.array([[2]], np.int32)))
    assert caught.value.error_class is ErrorClass.UNKNOWN_INPUT
    assert "filled by the stage" in caught.value.reason


def test_bind_refuses_a_model_that_does_not_fit() -> None:
    config = PaddingConfig(input="tokens", buckets=[4], trim_outputs=["pooled"])
    padder = Padder(config, "pool", "token_pool", lambda: TOKEN_POOL)
    with pytest.raises(ConfigError, match=r"padding\.trim_outputs 'pooled' has shape \[4\]"):
        padder.bind()


def test_mixed_lengths_share_one_batch_key_per_bucket() -> None:
    """The whole point: after padding, the shapes (hence the backend's batch key) are per bucket."""
    padder = _padder()
    shapes = {padder.pad(_request(np.ones((1, n), np.float32))).request.inputs["tokens"].shape for n in (1, 2, 3, 4)}
    assert shapes == {(1, 4)}


# ------------------------------------------------------------------- the element bound


def test_a_batch_is_released_by_elements_before_rows() -> None:
    """At most ``max_elements`` per batch: the item that would pass it starts the next one."""
    batcher: DynamicBatcher[str] = DynamicBatcher(max_rows=64, max_delay_s=10, max_elements=256)
    assert batcher.add("k", "a", rows=1, now=0, elements=128) == []
    assert batcher.add("k", "b", rows=1, now=0, elements=128) == []  # 256: at the bound, not past it
    [full] = batcher.add("k", "c", rows=1, now=0, elements=16)
    assert full.items == ["a", "b"] and full.elements == 256 and full.rows == 2
    [alone] = batcher.add("j", "huge", rows=1, now=0, elements=1000)
    assert alone.items == ["huge"]
