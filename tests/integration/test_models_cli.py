"""`pipeline models ...` run as a user runs it: a subprocess against the real S3 store and Triton.

The session fixtures (``tests/conftest.py``) provide a bucket that holds
``sample_models/`` and a Triton that loaded ``dense_classifier`` and
``silero_vad`` from it (``s3://``, explicit model control).
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import PipelineError
from pipeline.modelstore.store import ModelStore
from pipeline.settings import Endpoints
from pipeline.triton.admin import TritonAdmin
from tests.helpers import cli
from tests.helpers.cli import assert_one_line_error

pytestmark = [pytest.mark.triton, pytest.mark.s3]

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_MODELS = REPO_ROOT / "sample_models"


#: Loading a model into Triton from S3 takes a while on a 2-core machine.
run_cli = functools.partial(cli.run_cli, timeout=180)


def list_json(env: dict[str, str]) -> dict[str, Any]:
    result = run_cli(env, "models", "list", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def row_of(listing: dict[str, Any], name: str) -> dict[str, Any]:
    rows = [row for row in listing["models"] if row["name"] == name]
    assert rows, f"{name} not listed: {[r['name'] for r in listing['models']]}"
    return rows[0]


def ready_versions(row: dict[str, Any]) -> list[str]:
    return [s["version"] for s in row["triton"] or [] if s["state"] == "READY"]


# --------------------------------------------------------------------------- list


def test_list_shows_sample_models_ready(cli_env: dict[str, str]) -> None:
    listing = list_json(cli_env)
    assert listing["triton"]["error"] is None
    for name in ("dense_classifier", "silero_vad"):
        row = row_of(listing, name)
        assert row["in_store"] and row["versions"] == [1] and row["files"] >= 2
        assert ready_versions(row) == ["1"]

    table = run_cli(cli_env, "models", "list")
    assert table.returncode == 0, table.stderr
    lines = {line.split()[1]: line for line in table.stdout.splitlines() if line.count("│") > 2}
    assert "READY" in lines["dense_classifier"]
    assert "READY" in lines["silero_vad"]


def test_list_without_triton_still_lists_store(cli_env: dict[str, str]) -> None:
    result = run_cli({**cli_env, "PIPELINE_TRITON_GRPC_URL": "127.0.0.1:1"}, "models", "list")
    assert result.returncode == 0, result.stderr
    assert "dense_classifier" in result.stdout and "silero_vad" in result.stdout
    warning = result.stderr.strip().splitlines()
    assert len(warning) == 1 and "cannot reach Triton at 127.0.0.1:1" in warning[0]


# --------------------------------------------------------------------------- inspect


def test_inspect_dense_classifier_json(cli_env: dict[str, str]) -> None:
    result = run_cli(cli_env, "models", "inspect", "dense_classifier", "--json")
    assert result.returncode == 0, result.stderr
    description = json.loads(result.stdout)
    assert description["name"] == "dense_classifier"
    assert description["max_batch_size"] == 64
    assert description["versions"] == [1]
    [features] = [i for i in description["inputs"] if i["name"] == "features"]
    # `shape` is per item (config dims); `batched_shape` is Triton's metadata, -1 = batch.
    assert features == {
        "name": "features",
        "datatype": "FP32",
        "shape": [16],
        "batched_shape": [-1, 16],
        "optional": False,
    }
    assert description["outputs"], "dense_classifier declares outputs"
    assert description["dynamic_batching"] is not None
    assert description["sequence_batching"] is None
    assert description["instance_groups"][0]["kind"] == "CPU"


def test_inspect_silero_vad_shows_sequence_batching(cli_env: dict[str, str]) -> None:
    result = run_cli(cli_env, "models", "inspect", "silero_vad")
    assert result.returncode == 0, result.stderr
    assert "sequence_batching" in result.stdout
    assert re.search(r"CORRID\s.*CORRID", result.stdout), result.stdout

    data = json.loads(run_cli(cli_env, "models", "inspect", "silero_vad", "--json").stdout)
    sequence = data["sequence_batching"]
    assert sequence["strategy"] in ("direct", "oldest")
    assert sequence["max_sequence_idle_microseconds"] > 0
    assert "CORRID" in {c["kind"] for c in sequence["controls"]}


def test_inspect_unknown_model_is_one_line(cli_env: dict[str, str]) -> None:
    result = run_cli(cli_env, "models", "inspect", "no_such_model")
    assert_one_line_error(result, "no_such_model")


# --------------------------------------------------------------------------- errors


def test_push_without_config_uploads_nothing(
    cli_env: dict[str, str], endpoints: Endpoints, tmp_path: Path
) -> None:
    good = f"valid_{uuid.uuid4().hex[:8]}"
    shutil.copytree(SAMPLE_MODELS / "dense_classifier", tmp_path / good)
    _rename_config(tmp_path / good, good)
    (tmp_path / "foo" / "1").mkdir(parents=True)
    (tmp_path / "foo" / "1" / "model.py").write_text("pass\n")

    result = run_cli(cli_env, "models", "push", str(tmp_path))

    assert_one_line_error(result, f"{tmp_path / 'foo'}: no config.pbtxt")
    stored = {m.name for m in ModelStore(endpoints.s3).list_models()}
    assert good not in stored, "a valid model was uploaded although another one was invalid"


def test_unreachable_triton_is_one_line_and_fast(cli_env: dict[str, str]) -> None:
    env = {**cli_env, "PIPELINE_TRITON_GRPC_URL": "127.0.0.1:1"}
    for args in (("inspect", "dense_classifier"), ("load", "dense_classifier")):
        started = time.monotonic()
        result = run_cli(env, "models", *args)
        assert_one_line_error(result, "cannot reach Triton at 127.0.0.1:1")
        assert time.monotonic() - started < 20


def test_unreachable_s3_is_one_line(cli_env: dict[str, str]) -> None:
    env = {**cli_env, "PIPELINE_S3_ENDPOINT": "http://127.0.0.1:1"}
    assert_one_line_error(run_cli(env, "models", "list"), "cannot reach S3 at http://127.0.0.1:1")
    push = run_cli(env, "models", "push", str(SAMPLE_MODELS / "dense_classifier"))
    assert_one_line_error(push, "cannot reach S3 at http://127.0.0.1:1")


# --------------------------------------------------------------------------- push, load, unload


def _rename_config(model_dir: Path, name: str) -> None:
    config = model_dir / "config.pbtxt"
    text, count = re.subn(r'(?m)^name:\s*"[^"]*"', f'name: "{name}"', config.read_text())
    assert count == 1, "sample config.pbtxt has no top-level name line"
    config.write_text(text)


def test_push_copy_load_list_unload(
    cli_env: dict[str, str], endpoints: Endpoints, tmp_path: Path
) -> None:
    name = f"dense_copy_{uuid.uuid4().hex[:8]}"
    model_dir = tmp_path / name
    shutil.copytree(
        SAMPLE_MODELS / "dense_classifier", model_dir, ignore=shutil.ignore_patterns("__pycache__")
    )
    _rename_config(model_dir, name)
    store = ModelStore(endpoints.s3)
    try:
        # A first push carries an extra file; the second push must remove it from the store.
        (model_dir / "1" / "stale.txt").write_text("gone in the next push")
        first = run_cli(cli_env, "models", "push", str(model_dir))
        assert first.returncode == 0, first.stderr
        files_with_extra = row_of(list_json(cli_env), name)["files"]
        (model_dir / "1" / "stale.txt").unlink()

        pushed = run_cli(cli_env, "models", "push", str(tmp_path), "--model", name, "--load")
        assert pushed.returncode == 0, pushed.stderr
        assert name in pushed.stdout and "READY" in pushed.stdout

        row = row_of(list_json(cli_env), name)
        assert row["files"] == files_with_extra - 1
        assert ready_versions(row) == ["1"]
        table = run_cli(cli_env, "models", "list")
        [line] = [line for line in table.stdout.splitlines() if f" {name} " in line]
        assert "READY" in line

        described = json.loads(run_cli(cli_env, "models", "inspect", name, "--json").stdout)
        assert described["name"] == name and described["max_batch_size"] == 64

        unloaded = run_cli(cli_env, "models", "unload", name)
        assert unloaded.returncode == 0, unloaded.stderr
        assert ready_versions(row_of(list_json(cli_env), name)) == []
    finally:
        _cleanup(endpoints, store, name)


def _cleanup(endpoints: Endpoints, store: ModelStore, name: str) -> None:
    """Leave the shared Triton and bucket as the session fixtures made them."""
    with TritonAdmin(endpoints.triton) as admin:
        try:
            admin.unload(name)
        except PipelineError:
            pass  # already unloaded, or never loaded
    try:
        store.delete_model(name)
    except PipelineError:
        pass  # never uploaded
