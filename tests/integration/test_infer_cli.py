"""``pipeline infer``: one request from the shell; a result exits 0, a dead letter exits 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run, run_cli
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.topology_process import pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton]


def _request(shape: list[int], data: list[float]) -> str:
    return json.dumps({"inputs": [{"name": "features", "shape": shape, "datatype": "FP32", "data": data}]})


def test_infer_prints_result_or_dead_letter_with_distinct_exit_codes(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_topology(tmp_path, partitions=1)
    features = random_features(1, seed=5)
    with pipeline_process(topo, cli_env, tmp_path):
        good = run_cli(cli_env, "infer", str(topo.path), _request([1, 16], features.ravel().tolist()), timeout=60)
        assert good.returncode == 0, good.stderr
        result = json.loads(good.stdout)
        assert result["kind"] == "result" and result["outputs"]["logits"]["shape"] == [1, 4]
        expected = mlp_reference(features).ravel().tolist()
        assert result["outputs"]["logits"]["data"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
        assert good.stderr.splitlines()[0].startswith(f"endpoints: kafka {kafka_bootstrap}")

        bad = run([sys.executable, "-m", "pipeline", "infer", str(topo.path), "-"], cli_env, timeout=60, stdin="")
        assert bad.returncode == 1 and "<stdin>: file is empty" in bad.stderr

        dead = run_cli(
            {**cli_env, "PIPELINE_NO_EMBEDDED": "1"}, "infer", str(topo.path), _request([1, 3], [0.0, 0.0, 0.0]),
            timeout=60,
        )
        assert dead.returncode == 2, dead.stderr
        letter = json.loads(dead.stdout)
        assert (letter["kind"], letter["stage"], letter["error_class"]) == ("dead-letter", "classify", "shape-mismatch")
