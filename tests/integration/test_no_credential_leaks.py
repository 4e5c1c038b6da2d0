"""No credential is ever printed or logged: real commands against the session's real services.

The S3 keys are the ones the store really checks (the session's own; random per
session for the embedded store) and the Kafka SASL password a fresh canary that
one command really sends. Every command's stdout and stderr, the worker's log and
every service log are then searched for them. `pipeline up` is checked as well:
it writes its random keys to its state file (mode 0600) and must print neither.

Also here, because it needs a running worker: the health and metrics endpoint
binds loopback unless ``PIPELINE_HEALTH_HOST`` says otherwise (a second loopback
address, 127.0.0.2, tells a 127.0.0.1 bind from a 0.0.0.0 one).
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pipeline.embedded.process import free_port
from pipeline.settings import S3Settings
from tests.helpers.cli import ok, run_cli
from tests.helpers.topology_process import PipelineProcess, TopologyFiles, pipeline_process, write_topology
from tests.integration.test_embedded_stack import _start_up

pytestmark = [pytest.mark.kafka, pytest.mark.s3, pytest.mark.triton, pytest.mark.slow]

REQUEST_LIMIT = 2048  # the topology's max_request_bytes: one request above it is dead-lettered,
DEAD_LETTER_LIMIT = "1024"  # and as its dead letter is larger than this, it is a claim check (S3)


def _status(url: str) -> int | None:
    """HTTP status at ``url``; None when nothing listens there."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _leaks(secret_values: list[str], texts: dict[str, str]) -> list[str]:
    """``where: which secret`` for every text that contains one."""
    return [
        f"{where}: secret #{index}"
        for where, text in texts.items()
        for index, value in enumerate(secret_values)
        if value in text
    ]


def _files(*folders: Path) -> dict[str, str]:
    """Every file below ``folders``, as text."""
    return {
        str(path): path.read_bytes().decode("utf-8", errors="replace")
        for folder in folders
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _big_request(path: Path) -> Path:
    """A valid dense_classifier request over ``REQUEST_LIMIT`` (a long request parameter)."""
    request = {
        "id": "too-big",
        "inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}],
        "parameters": {"padding": "p" * (2 * REQUEST_LIMIT)},
    }
    path.write_text(json.dumps(request))
    return path


def _outputs(results: dict[str, subprocess.CompletedProcess[str]]) -> dict[str, str]:
    return {f"`{name}` {stream}": getattr(r, stream) for name, r in results.items() for stream in ("stdout", "stderr")}


def test_no_command_prints_or_logs_a_credential(
    cli_env: dict[str, str], s3_settings: S3Settings, sample_models_dir: Path, service_log_dir: Path, tmp_path: Path
) -> None:
    assert s3_settings.access_key is not None and s3_settings.secret_key is not None
    keys = [s3_settings.access_key.get_secret_value(), s3_settings.secret_key.get_secret_value()]
    sasl_password = f"canary-{secrets.token_hex(12)}"
    watched = [*keys, sasl_password]
    assert all(len(value) >= 8 for value in watched), "too short to search for meaningfully"
    env = {**cli_env, "PIPELINE_KAFKA_SASL_USERNAME": "leak-test", "PIPELINE_KAFKA_SASL_PASSWORD": sasl_password}
    assert env["AWS_SECRET_ACCESS_KEY"] == keys[1]
    store_env = {**env, "PIPELINE_S3_BUCKET": f"leaks-{secrets.token_hex(4)}"}  # a bucket of its own
    repo = tmp_path / "repo"
    shutil.copytree(sample_models_dir / "dense_classifier", repo / "dense_classifier")
    topo = write_topology(tmp_path, partitions=1, stage={"max_request_bytes": REQUEST_LIMIT})

    results = {
        "validate": ok(run_cli(env, "validate", str(topo.path))),
        "models push": ok(run_cli(store_env, "models", "push", str(repo))),
        "models list": ok(run_cli(store_env, "models", "list")),
        "models list --json": ok(run_cli(store_env, "models", "list", "--json")),
    }
    stored = [m["name"] for m in json.loads(results["models list --json"].stdout)["models"] if m["in_store"]]
    assert stored == ["dense_classifier"]
    with pipeline_process(topo, {**env, "PIPELINE_KAFKA_DEAD_LETTER_MAX_BYTES": DEAD_LETTER_LIMIT}, tmp_path) as worker:
        results["produce --random"] = ok(run_cli(env, "produce", "--topology", str(topo.path), "--random", "--count", "5"))
        big = _big_request(tmp_path / "big.json")
        results["produce --json"] = ok(run_cli(env, "produce", "--topology", str(topo.path), "--json", str(big)))
        results["consume"] = ok(
            run_cli(env, "consume", "--topology", str(topo.path), "--from-beginning", "--count", "6", "--timeout", "60")
        )
        assert "oversized-value" in results["consume"].stdout  # the claim check went through S3, keys in use
        assert worker.metric("pipeline_claim_checks_total") == 1
        # Loopback by default: the worker answers on 127.0.0.1 only.
        assert _status(f"http://127.0.0.1:{worker.http_port}/livez") == 200
        assert _status(f"http://127.0.0.2:{worker.http_port}/livez") is None
        assert worker.terminate() == 0, worker.log()
        worker_log = worker.log_path.read_text()
    assert "health/metrics on http://127.0.0.1:" in worker_log

    # Failures print reasons, never keys: an S3 store that is not there, and SASL the broker refuses.
    nowhere = {**store_env, "PIPELINE_S3_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    results["models list (no store)"] = run_cli(nowhere, "models", "list")
    sasl = {**env, "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}
    results["produce (SASL refused)"] = run_cli(sasl, "produce", "--topic", topo.input_topic, "--random",
                                                "--model", "dense_classifier", "--count", "1", timeout=120)
    assert "cannot reach S3" in results["models list (no store)"].stderr
    assert "cannot reach Kafka" in results["produce (SASL refused)"].stderr  # the broker speaks no SASL

    texts = {**_outputs(results), "worker log": worker_log, **_files(service_log_dir, tmp_path)}
    assert len(texts) > 12
    assert _leaks(watched, texts) == []


class _Worker(PipelineProcess):
    """A `pipeline run` whose health endpoint is at ``host`` (the helper assumes 127.0.0.1)."""

    host = "127.0.0.2"

    def get(self, path: str) -> tuple[int, str]:
        return _status(f"http://{self.host}:{self.http_port}{path}") or 0, ""


def test_health_host_comes_from_the_environment(cli_env: dict[str, str], tmp_path: Path) -> None:
    topo: TopologyFiles = write_topology(tmp_path, partitions=1)
    env = {**cli_env, "PIPELINE_HEALTH_HOST": _Worker.host}
    worker = _Worker(topo, env, tmp_path / "run.log").start()
    try:
        assert _status(f"http://127.0.0.2:{worker.http_port}/readyz") == 200
        assert _status(f"http://127.0.0.1:{worker.http_port}/readyz") is None
        assert f"health/metrics on http://127.0.0.2:{worker.http_port}/metrics" in worker.log()
        assert worker.terminate() == 0, worker.log()
    finally:
        if worker.proc is not None and worker.proc.poll() is None:
            worker.kill()


def test_pipeline_up_prints_no_key_and_commands_still_find_them(tmp_path: Path) -> None:
    proc, env, out = _start_up(tmp_path)
    try:
        state_file = tmp_path / "state" / "stack.json"
        stack_env = json.loads(state_file.read_text())["environment"]
        keys = [stack_env["AWS_ACCESS_KEY_ID"], stack_env["AWS_SECRET_ACCESS_KEY"]]
        assert state_file.stat().st_mode & 0o077 == 0  # the keys' one home: readable by its owner only
        listed = ok(run_cli(env, "models", "list"))  # reads the keys from the state file
        assert "dense_classifier" in listed.stdout
        printed = out.read_text()
        assert "export PIPELINE_S3_ENDPOINT=" in printed and "S3 keys: random for this stack" in printed
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    assert code == 0, out.read_text()
    texts = {"up": out.read_text(), **_outputs({"models list": listed}), **_files(tmp_path / "logs")}
    assert _leaks(keys, texts) == []
