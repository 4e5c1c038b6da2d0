"""Length-aware batching end to end: `pipeline run` with ``padding:`` against the real broker and
Triton (``sample_models/token_pool``).

Mixed-length requests must answer exactly like unpadded single Triton calls, in fewer Triton
calls than grouping by exact shape could ever take; a request longer than the last bucket
and one that sends the stage-filled lengths input are dead-lettered with their class.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pipeline.contract.records import Record, read_dead_letter
from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from pipeline.settings import TritonSettings
from pipeline.triton.client import sync_client
from tests.helpers.cli import ok, run_cli
from tests.helpers.kafka_io import produce
from tests.helpers.topology_process import collect_outputs, distinct_keys, pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

BUCKETS = [16, 32, 64]
PADDING: dict[str, Any] = {
    "input": "tokens",
    "pad_value": 0.0,
    "buckets": BUCKETS,
    "lengths_input": "lengths",
    "trim_outputs": ["per_token"],
}


def _stage(**padding: Any) -> dict[str, Any]:
    return {
        "name": "pool",
        "model": "token_pool",
        # Long enough for a burst to meet in its buckets; short enough for a test.
        "batching": {"max_queue_delay_ms": 300.0, "max_inflight_batches": 2},
        "padding": {**PADDING, **padding},
    }


def _unpadded(client: grpcclient.InferenceServerClient, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """The reference: the request alone, exactly its length, lengths filled by hand."""
    lengths = np.full((tokens.shape[0], 1), tokens.shape[1], np.int32)
    inputs = []
    for name, array, datatype in (("tokens", tokens, "FP32"), ("lengths", lengths, "INT32")):
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer("token_pool", inputs)
    return {name: result.as_numpy(name) for name in ("pooled", "per_token")}


def test_mixed_lengths_share_bucketed_batches_and_answer_like_single_calls(
    kafka_bootstrap: str, cli_env: dict[str, str], triton_grpc_url: str, tmp_path: Path
) -> None:
    rng = np.random.default_rng(14)
    lengths = [int(n) for n in rng.integers(1, 65, size=150)]
    rows = [2 if i % 10 == 0 else 1 for i in range(len(lengths))]
    tokens = {f"ok-{i}": rng.standard_normal((r, n)).astype(np.float32) for i, (n, r) in enumerate(zip(lengths, rows, strict=True))}
    records = [encode_request({"tokens": t}, correlation_id=cid) for cid, t in tokens.items()]
    too_long = encode_request({"tokens": np.ones((1, 65), np.float32)}, correlation_id="too-long")
    sends_lengths = encode_request(
        {"tokens": np.ones((1, 3), np.float32), "lengths": np.array([[3]], np.int32)},
        correlation_id="sends-lengths",
    )
    mixed: list[Record] = [*records, too_long, sends_lengths]
    random.Random(3).shuffle(mixed)
    topo = write_topology(tmp_path, partitions=1, stage=_stage())
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, mixed))
        out = collect_outputs(kafka_bootstrap, topo, distinct_keys(len(mixed)), timeout=120)
        calls = worker.metric("pipeline_batch_size_count", stage="pool")
        assert worker.metric_reaching("pipeline_results_total", len(records)) == len(records)
        assert worker.terminate(timeout=60) == 0, worker.log()

    # Exactly one outcome per record.
    assert sorted(r.key.decode() for r in out.records) == sorted(r.key.decode() for r in mixed)
    dead = {r.key.decode(): read_dead_letter(r.headers) for r in out.on(topo.dead_letter_topic)}
    assert dead["too-long"].error_class == "length-out-of-range"
    assert dead["too-long"].reason == "input 'tokens' has length 65, longer than the largest padding bucket 64"
    assert dead["sends-lengths"].error_class == "unknown-input"
    assert "'lengths' is filled by the stage" in dead["sends-lengths"].reason
    assert set(dead) == {"too-long", "sends-lengths"}

    # Exactly the answers of unpadded single calls: no padding visible, none leaked into the maths.
    results = out.on(topo.result_topic)
    assert len(results) == len(records)
    with sync_client(TritonSettings(grpc_url=triton_grpc_url)) as client:
        for record in results:
            response = decode_response(record.value, record.headers)
            sent = tokens[response.correlation_id]
            expected = _unpadded(client, sent)
            assert response.outputs["per_token"].shape == sent.shape
            assert response.outputs["pooled"].shape == (sent.shape[0], 4)
            # Elementwise outputs are bit-identical; sums over a longer (zero-padded) row may
            # differ in the last float32 bit (numpy's pairwise summation groups differently).
            np.testing.assert_array_equal(response.outputs["per_token"], expected["per_token"])
            np.testing.assert_allclose(
                response.outputs["pooled"], expected["pooled"], rtol=1e-6, atol=1e-6, err_msg=response.correlation_id
            )

    # Fewer Triton calls than exact-shape grouping could need: at least one per distinct shape.
    exact_minimum = len({t.shape[1:] for t in tokens.values()})
    assert 0 < calls < exact_minimum / 4, f"{calls} calls, exact shapes need at least {exact_minimum}"
    assert calls >= len(BUCKETS)


def test_too_long_exact_goes_unpadded_in_its_own_shape(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """``too_long: exact``: a request past the last bucket is served at its own length, trimmed nothing.
    With ``warmup: true``: the warm-up call gives the variable-length input length 1 (it used to
    leave out inputs with a -1 dim, so a padded stage's warm-up failed for want of ``tokens``)."""
    tokens = np.arange(70, dtype=np.float32)[None, :] / 10
    topo = write_topology(tmp_path, partitions=1, stage={**_stage(too_long="exact"), "warmup": True})
    with pipeline_process(topo, cli_env, tmp_path):
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, [encode_request({"tokens": tokens}, correlation_id="long")]))
        out = collect_outputs(kafka_bootstrap, topo, distinct_keys(1), timeout=60)
    [result] = out.on(topo.result_topic)
    response = decode_response(result.value, result.headers)
    np.testing.assert_allclose(response.outputs["per_token"], np.tanh(tokens) * 2, rtol=1e-6)
    np.testing.assert_allclose(response.outputs["pooled"][0, :3], [tokens.sum(), tokens.mean(), tokens.max()], rtol=1e-5)


def test_validate_checks_padding_against_the_served_model(cli_env: dict[str, str], tmp_path: Path) -> None:
    good = write_topology(tmp_path, stage=_stage())
    ok(run_cli(cli_env, "validate", str(good.path)))
    ok(run_cli(cli_env, "validate", "topologies/padded.yaml"))
    bad = write_topology(tmp_path, stage=_stage(trim_outputs=["pooled"], lengths_input="per_token"))
    result = run_cli(cli_env, "validate", str(bad.path))
    assert result.returncode == 1, result.stdout + result.stderr
    text = result.stdout + result.stderr
    assert "padding.lengths_input 'per_token' is not an input of model 'token_pool' (its inputs: tokens, lengths)" in text
    assert "padding.trim_outputs 'pooled' has shape [4] in model 'token_pool': no variable (-1) dim to trim" in text
