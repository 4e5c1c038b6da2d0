"""Interop with kcat, a client that shares no code with us (C, librdkafka).

What kcat writes, ``pipeline consume`` decodes; what ``pipeline produce``
writes, kcat reads as key, headers and a JSON body; and a whole topology
(``pipeline run``) answers requests typed with kcat with the logits a numpy
forward pass of the ONNX weights gives.

About librdkafka versions: Debian 12's kcat links librdkafka 2.0.2, whose
parser of KIP-482 tagged fields skips ``length - 1`` bytes per field. Brokers
that send tagged fields in ApiVersions v3 (Tansu, the embedded broker, sends
all four of them) break it with "ApiVersionRequest failed: Local: Read
underflow"; librdkafka 2.1+ parses them correctly. When the system library
fails that way, kcat is run with the librdkafka that the ``confluent-kafka``
wheel ships (same ABI, ``LD_LIBRARY_PATH``); kcat itself stays Debian's.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.contract.request import decode_request
from tests.helpers.cli import ok, run, run_cli
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.topology_process import pipeline_process, write_topology

pytestmark = [pytest.mark.kafka]


# --------------------------------------------------------------------------- kcat


class Kcat:
    """Runs the ``kcat`` binary against one broker, with an environment that lets it connect."""

    def __init__(self, binary: str, bootstrap: str, env: dict[str, str]) -> None:
        self.binary = binary
        self.bootstrap = bootstrap
        self.env = env

    def run(
        self, *args: str, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = run(
            [self.binary, "-b", self.bootstrap, *args], self.env, timeout=timeout, stdin=stdin
        )
        assert result.returncode == 0, f"kcat {' '.join(args)} failed:\n{result.stderr}"
        return result

    def produce(self, topic: str, body: str, *headers: str, key: str | None = None, key_delimiter: str | None = None) -> None:
        args = ["-P", "-t", topic]
        if key is not None:
            args += ["-k", key]
        if key_delimiter is not None:
            args += ["-K", key_delimiter]
        for header in headers:
            args += ["-H", header]
        self.run(*args, stdin=body)

    def consume(
        self, topic: str, count: int, *, until_end: bool = True, timeout: float = 60
    ) -> list[tuple[str, dict[str, str], str]]:
        """``count`` records as ``(key, headers, value)``, read from the beginning."""
        args = ["-C", "-t", topic, "-o", "beginning", "-c", str(count), "-f", "%k\\t%h\\t%s\\n"]
        if until_end:
            args.append("-e")
        out = self.run(*args, timeout=timeout).stdout
        records = []
        for line in out.splitlines():
            key, headers, value = line.split("\t", 2)
            pairs = (item.split("=", 1) for item in headers.split(",") if item)
            records.append((key, {name: value for name, value in pairs}, value))
        return records


def _connects(binary: str, bootstrap: str, env: dict[str, str]) -> tuple[bool, str]:
    probe = run([binary, "-L", "-b", bootstrap, "-m", "10"], env, timeout=30)
    return probe.returncode == 0, probe.stderr.strip()[-300:]


def _bundled_librdkafka() -> Path | None:
    """librdkafka from the confluent-kafka wheel (``confluent_kafka.libs/librdkafka-<hash>.so.1``)."""
    spec = importlib.util.find_spec("confluent_kafka")
    if spec is None or spec.origin is None:
        return None
    libs = Path(spec.origin).resolve().parents[1] / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    return found[0] if found else None


def _librdkafka_version(binary: str) -> tuple[int, ...]:
    """The librdkafka kcat links, from ``kcat -V`` ("... librdkafka 2.0.2 builtin.features=...")."""
    out = subprocess.run([binary, "-V"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"librdkafka (\d+)\.(\d+)", out)
    return tuple(int(part) for part in match.groups()) if match else (0,)


@pytest.fixture(scope="module")
def kcat(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Kcat:
    """kcat with the system librdkafka when that one parses tagged fields (2.1+), else the wheel's."""
    binary = shutil.which("kcat")
    assert binary, "kcat is not installed: scripts/install.sh installs it (apt package kcat)"
    system = dict(os.environ)
    candidates = [system]
    library = _bundled_librdkafka()
    if library is not None:
        folder = tmp_path_factory.mktemp("librdkafka")
        (folder / "librdkafka.so.1").symlink_to(library)
        path = os.pathsep.join(filter(None, [str(folder), system.get("LD_LIBRARY_PATH")]))
        bundled = {**system, "LD_LIBRARY_PATH": path}
        # Probing a library that cannot connect costs the whole metadata timeout: try the likely one first.
        candidates = (
            [bundled, system] if _librdkafka_version(binary) < (2, 1) else [system, bundled]
        )
    failures = []
    for env in candidates:
        works, why = _connects(binary, kafka_bootstrap, env)
        if works:
            return Kcat(binary, kafka_bootstrap, env)
        failures.append(why)
    hint = (
        ""
        if library
        else "; installing confluent-kafka (its wheel ships librdkafka >= 2.1) may help"
    )
    pytest.fail(
        f"kcat cannot talk to the broker at {kafka_bootstrap}: {' / '.join(failures)}{hint}"
    )


def _request_body(correlation_id: str | None, features: list[float]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": features}]
    }
    if correlation_id is not None:
        body = {"id": correlation_id, **body}
    return body


# --------------------------------------------------------------------------- tests


def test_kcat_request_is_read_by_pipeline_consume(kcat: Kcat, cli_env: dict[str, str]) -> None:
    topic = f"kcat-in-{uuid.uuid4().hex[:10]}"
    features = [float(i) / 4 for i in range(16)]
    kcat.produce(
        topic,
        json.dumps(_request_body(None, features)),
        "content-type=application/json",
        "correlation-id=kc-1",
        key="key-1",
    )
    args = ["--topic", topic, "--from-beginning", "--json", "--count", "1", "--timeout", "30"]
    out = ok(run_cli(cli_env, "consume", *args))
    line, summary = (json.loads(text) for text in out.stdout.splitlines())
    assert line["kind"] == "request" and line["key"] == "key-1" and line["correlation_id"] == "kc-1"
    request = decode_request(
        base64.b64decode(line["value_b64"]),
        [(name, value.encode()) for name, value in line["headers"]],
    )
    assert request.correlation_id == "kc-1" and request.content_type == "application/json"
    np.testing.assert_array_equal(request.inputs["features"], np.array([features], np.float32))
    assert summary["requests"] == 1 and summary["undecodable"] == 0


def test_pipeline_produce_is_read_by_kcat(
    kcat: Kcat, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topic = f"kcat-out-{uuid.uuid4().hex[:10]}"
    features = [1.5] * 16
    source = tmp_path / "request.json"
    source.write_text(json.dumps(_request_body("ours-1", features)))
    args = ["--topic", topic, "--json", str(source), "--keep-ids", "--key", "k-9"]
    ok(run_cli(cli_env, "produce", *args))

    ((key, headers, value),) = kcat.consume(topic, 1)
    assert key == "k-9"
    assert headers["content-type"] == "application/json"
    assert headers["correlation-id"] == "ours-1"
    assert headers["sent-at-ms"].isdigit()
    body = json.loads(value)
    assert body["id"] == "ours-1"
    assert body["inputs"] == [
        {"name": "features", "shape": [1, 16], "datatype": "FP32", "data": features}
    ]


@pytest.mark.triton
@pytest.mark.slow
def test_topology_round_trip_through_kcat(
    kcat: Kcat, kafka_bootstrap: str, triton_grpc_url: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """kcat types 20 JSON requests into a running topology; kcat reads 20 correct results back."""
    topology = write_topology(tmp_path)
    env = {**cli_env, "KAFKA_BOOTSTRAP": kafka_bootstrap, "TRITON_URL": triton_grpc_url}
    features = random_features(20, seed=11)
    ids = [f"rt-{uuid.uuid4().hex[:6]}-{i}" for i in range(20)]
    with pipeline_process(topology, env, tmp_path) as process:
        lines = "\n".join(
            f"{cid}\t{json.dumps(_request_body(cid, row.tolist()))}"
            for cid, row in zip(ids, features, strict=True)
        )
        kcat.produce(
            topology.input_topic, lines + "\n", "content-type=application/json", key_delimiter="\t"
        )
        results = kcat.consume(topology.result_topic, 20, until_end=False, timeout=120)
        assert process.terminate() == 0, process.log()

    assert sorted(key for key, _, _ in results) == sorted(ids)
    expected = dict(zip(ids, mlp_reference(features), strict=True))
    for key, headers, value in results:
        body = json.loads(value)
        assert headers["content-type"] == "application/json"  # a JSON request gets a JSON result
        assert headers["correlation-id"] == key == body["id"]
        assert (
            headers["pipeline-stage"] == "classify" and headers["model-name"] == "dense_classifier"
        )
        assert body["model_name"] == "dense_classifier"
        (logits,) = body["outputs"]
        assert (
            logits["name"] == "logits"
            and logits["datatype"] == "FP32"
            and logits["shape"] == [1, 4]
        )
        np.testing.assert_allclose(np.array(logits["data"]), expected[key], rtol=1e-4, atol=1e-5)
