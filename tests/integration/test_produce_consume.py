"""`pipeline produce` and `pipeline consume`, run as a user runs them, against the real broker.

Each test writes to its own topic (``--topic`` with a uuid), so no topology
needs to run: what ``produce`` wrote is read back raw by ``consume --json``
and decoded here with the contract's own decoder. The summary test produces
result and dead-letter records itself, with known timestamps, so every number
in the summary has an exact expected value.

The last tests need no services: the WAV reader on formats ``espeak-ng`` does
not write, and the pacer against a fake clock.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from pipeline.contract.errors import ErrorClass
from pipeline.contract.records import dead_letter_headers, result_headers
from pipeline.contract.request import InferenceRequest, decode_request, encode_request
from pipeline.contract.response import encode_response
from pipeline.tools.audio import read_wav
from pipeline.tools.pacing import Pacer
from pipeline.tools.sources import RecordBuilder, RecordOptions, random_requests
from pipeline.triton.admin import ModelDescription, TensorSpec
from tests.helpers.cli import assert_one_line_error, ok, run_cli
from tests.helpers.kafka_io import fill_two_partitions

REPO_ROOT = Path(__file__).resolve().parents[2]
DENSE = REPO_ROOT / "topologies" / "dense.yaml"


# --------------------------------------------------------------------------- helpers


def fields(text: str) -> dict[str, str]:
    """The plain summary, ``name   value`` per line, as a dict."""
    parsed = {}
    for line in text.splitlines():
        name, _, value = line.partition("  ")
        if value:
            parsed[name.strip()] = value.strip()
    return parsed


def produce(env: dict[str, str], *args: str) -> dict[str, str]:
    summary = fields(ok(run_cli(env, "produce", *args)).stdout)
    assert summary["failed"] == "0", summary
    return summary


def consume_json(
    env: dict[str, str], topic: str, count: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every record of ``topic`` from the beginning (``count`` of them), and the summary line."""
    result = ok(
        run_cli(
            env,
            "consume",
            "--topic",
            topic,
            "--from-beginning",
            "--json",
            "--count",
            str(count),
            "--values",
            "0",
            "--timeout",
            "30",
        )
    )
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines and lines[-1]["kind"] == "summary", result.stdout
    return lines[:-1], lines[-1]


def as_request(line: dict[str, Any]) -> InferenceRequest:
    """Decode a ``consume --json`` line back into the request the producer sent."""
    headers = [(name, value.encode()) for name, value in line["headers"]]
    return decode_request(base64.b64decode(line["value_b64"]), headers)


def header(line: dict[str, Any], name: str) -> str | None:
    values = [value for key, value in line["headers"] if key == name]
    return values[-1] if values else None


def new_topic(label: str) -> str:
    return f"client-{label}-{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------- produce


@pytest.mark.kafka
@pytest.mark.triton
def test_random_requests_paced_keyed_and_decodable(cli_env: dict[str, str]) -> None:
    topic = new_topic("random")
    summary = produce(
        cli_env,
        "--topology",
        str(DENSE),
        "--topic",
        topic,
        "--random",
        "--count",
        "50",
        "--rate",
        "100",
        "--seed",
        "7",
        "--id-prefix",
        "rnd-",
    )
    assert summary["sent"] == "50" and summary["acknowledged"] == "50"
    # 50 records at 100/s: the last is due 0.49 s after the first. A sanity bound, not a speed target.
    assert float(summary["elapsed"].split()[0]) >= 0.4

    records, totals = consume_json(cli_env, topic, 50)
    assert len(records) == 50
    assert totals["records"] == 50 and totals["requests"] == 50
    assert totals["distinct_correlation_ids"] == 50 and totals["duplicates"] == 0
    sent_at = []
    for line in records:
        request = as_request(line)
        assert line["kind"] == "request"
        assert request.correlation_id.startswith("rnd-") and line["key"] == request.correlation_id
        assert request.content_type == "application/vnd.oip.v2.infer-request+protobuf"
        assert request.datatypes == {"features": "FP32"}
        assert request.inputs["features"].shape == (1, 16)
        sent_at.append(int(header(line, "sent-at-ms") or 0))
    assert max(sent_at) - min(sent_at) >= 400  # the pacing shows in the send stamps too


def test_random_requests_follow_model_metadata_and_seed() -> None:
    """No server needed: a hand-made description stands in for Triton's answer."""
    model = ModelDescription(
        name="m",
        versions=[1],
        platform="",
        backend="python",
        max_batch_size=8,
        inputs=[
            TensorSpec("audio", "FP32", [-1], [-1, -1]),
            TensorSpec("ids", "INT64", [2, -1], [-1, 2, -1]),
            TensorSpec("mask", "BOOL", [3], [-1, 3]),
            TensorSpec("text", "BYTES", [1], [-1, 1]),
            TensorSpec("state", "FP32", [4], [-1, 4], optional=True),
        ],
        outputs=[],
    )
    first = next(random_requests(model, length=5, seed=3))
    again = next(random_requests(model, length=5, seed=3))
    assert {name: a.shape for name, a in first.inputs.items()} == {
        "audio": (1, 5),
        "ids": (1, 2, 5),
        "mask": (1, 3),
        "text": (1, 1),
    }
    assert first.datatypes == {"audio": "FP32", "ids": "INT64", "mask": "BOOL", "text": "BYTES"}
    assert first.inputs["ids"].dtype == np.int64 and first.inputs["mask"].dtype == np.bool_
    for name in first.inputs:
        np.testing.assert_array_equal(first.inputs[name], again.inputs[name])
    # Every datatype survives both wire forms.
    for form in ("protobuf", "json"):
        record = RecordBuilder(RecordOptions(form=form)).build(first)  # type: ignore[arg-type]
        decoded = decode_request(record.value, record.headers)
        for name, array in first.inputs.items():
            np.testing.assert_array_equal(decoded.inputs[name], array)


@pytest.mark.kafka
def test_json_file_and_json_lines(cli_env: dict[str, str], tmp_path: Path) -> None:
    single = tmp_path / "one.json"
    single.write_text(
        json.dumps(
            {
                "id": "mine-1",
                "inputs": [
                    {
                        "name": "features",
                        "shape": [2, 3],
                        "datatype": "FP32",
                        "data": [[1, 2, 3], [4, 5, 6.5]],
                    }
                ],
                "parameters": {"tenant": "a"},
            },
            indent=2,
        )
    )
    topic = new_topic("json")
    produce(cli_env, "--topic", topic, "--json", str(single), "--keep-ids")
    (line,), totals = consume_json(cli_env, topic, 1)
    request = as_request(line)
    assert request.correlation_id == "mine-1" and line["key"] == "mine-1"
    assert request.content_type == "application/json"  # a JSON file is sent as JSON by default
    assert request.parameters == {"tenant": "a"}
    np.testing.assert_array_equal(
        request.inputs["features"], np.array([[1, 2, 3], [4, 5, 6.5]], np.float32)
    )
    assert totals["requests"] == 1

    lines = tmp_path / "many.jsonl"
    rows = [[float(i), float(i) + 0.5] for i in range(3)]
    lines.write_text(
        "\n".join(
            json.dumps(
                {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": row}]}
            )
            for row in rows
        )
        + "\n\n"
    )
    topic = new_topic("jsonl")
    produce(
        cli_env,
        "--topic",
        topic,
        "--json",
        str(lines),
        "--count",
        "5",
        "--format",
        "protobuf",
        "--key",
        "fixed",
        "--priority",
        "3",
        "--deadline-ms",
        "60000",
    )
    records, totals = consume_json(cli_env, topic, 5)
    assert totals["distinct_correlation_ids"] == 5
    by_id = sorted(records, key=lambda r: r["correlation_id"])  # generated ids sort in send order
    for index, line in enumerate(by_id):
        request = as_request(line)
        assert request.content_type == "application/vnd.oip.v2.infer-request+protobuf"
        assert line["key"] == "fixed" and request.priority == 3
        assert request.deadline_ms == int(header(line, "sent-at-ms") or 0) + 60000
        np.testing.assert_array_equal(
            request.inputs["x"], np.array([rows[index % 3]])
        )  # the file cycles


@pytest.mark.kafka
@pytest.mark.triton
def test_npy_as_is_and_shaped_by_the_model(cli_env: dict[str, str], tmp_path: Path) -> None:
    matrix = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.save(tmp_path / "m.npy", matrix)
    topic = new_topic("npy")
    produce(cli_env, "--topic", topic, "--npy", str(tmp_path / "m.npy"), "--input", "x")
    (line,), _ = consume_json(cli_env, topic, 1)
    request = as_request(line)
    assert request.datatypes == {"x": "INT32"}
    np.testing.assert_array_equal(request.inputs["x"], matrix)

    # One item of dense_classifier's [-1, 16] FP32 input, saved as float64: batched and cast.
    vector = np.linspace(-1, 1, 16)
    np.save(tmp_path / "v.npy", vector)
    topic = new_topic("npy-model")
    produce(cli_env, "--topology", str(DENSE), "--topic", topic, "--npy", str(tmp_path / "v.npy"))
    (line,), _ = consume_json(cli_env, topic, 1)
    request = as_request(line)
    assert request.datatypes == {"features": "FP32"}
    np.testing.assert_array_equal(request.inputs["features"], vector.astype(np.float32)[None, :])


@pytest.mark.kafka
def test_wav_from_espeak(cli_env: dict[str, str], tmp_path: Path) -> None:
    espeak = shutil.which("espeak-ng")
    assert espeak, "espeak-ng is installed by scripts/install.sh"
    path = tmp_path / "speech.wav"
    subprocess.run(
        [espeak, "-w", str(path), "streaming inference"], check=True, capture_output=True
    )
    with wave.open(
        str(path)
    ) as wav:  # the reference: stdlib only, independent of pipeline.tools.audio
        assert wav.getsampwidth() == 2 and wav.getnchannels() == 1
        expected = (
            np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.float32) / 32768.0
        )

    topic = new_topic("wav")
    produce(cli_env, "--topic", topic, "--wav", str(path), "--input", "audio")
    (line,), _ = consume_json(cli_env, topic, 1)
    request = as_request(line)
    assert request.datatypes == {"audio": "FP32"}
    assert request.inputs["audio"].shape == (1, len(expected))
    np.testing.assert_array_equal(request.inputs["audio"][0], expected)


@pytest.mark.kafka
def test_user_errors_are_one_line(cli_env: dict[str, str], tmp_path: Path) -> None:
    topic = new_topic("errors")
    assert_one_line_error(
        run_cli(cli_env, "produce", "--topic", topic), "choose exactly one source"
    )
    assert_one_line_error(
        run_cli(cli_env, "produce", "--topic", topic, "--random", "--json", "x.json"),
        "got --json, --random",
    )
    assert_one_line_error(
        run_cli(cli_env, "produce", "--topic", topic, "--json", str(tmp_path / "missing.json")),
        "cannot read",
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"inputs": []}\n{"inputs": [}\n')
    assert_one_line_error(
        run_cli(cli_env, "produce", "--topic", topic, "--json", str(bad)), f"{bad}:2: invalid JSON"
    )
    typo = tmp_path / "typo.json"
    typo.write_text('{"input": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}')
    assert_one_line_error(
        run_cli(cli_env, "produce", "--topic", topic, "--json", str(typo)),
        "unknown key(s) in body: input",
    )
    assert_one_line_error(
        run_cli(cli_env, "consume", "--topic", topic, "--follow", "--timeout", "1"),
        "takes no --timeout",
    )

    nobody = {**cli_env, "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"}
    started = time.monotonic()
    single = tmp_path / "one.json"
    single.write_text('{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}')
    assert_one_line_error(
        run_cli(nobody, "produce", "--topic", topic, "--json", str(single)), "cannot reach Kafka"
    )
    assert_one_line_error(run_cli(nobody, "consume", "--topic", topic), "cannot reach Kafka")
    assert time.monotonic() - started < 60


# --------------------------------------------------------------------------- consume


async def _send_all(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes, list[tuple[str, bytes]], int]]
) -> None:
    """Produce ``(key, value, headers, timestamp_ms)`` to partition 0, in order, all acknowledged."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value, headers, timestamp in records:
            await producer.send_and_wait(
                topic, value, key=key, headers=headers, partition=0, timestamp_ms=timestamp
            )
    finally:
        await producer.stop()


def _result(
    correlation_id: str, *, key: str, sent_at: int, latency: int, logits: list[float]
) -> tuple[bytes, bytes, list[tuple[str, bytes]], int]:
    request_record = encode_request(
        {"features": np.zeros((1, 16), np.float32)},
        correlation_id=correlation_id,
        key=key,
        extra_headers=[("sent-at-ms", str(sent_at).encode()), ("x-app", b"kept")],
    )
    request = decode_request(request_record.value, request_record.headers)
    value, content_type = encode_response(
        request,
        {"logits": np.array([logits], np.float32)},
        model_name="dense_classifier",
        model_version="1",
    )
    headers = result_headers(
        request_record.headers,
        correlation_id=correlation_id,
        stage="classify",
        model_name="dense_classifier",
        model_version="1",
        content_type=content_type,
    )
    return key.encode(), value, headers, sent_at + latency


def _dead_letter(
    correlation_id: str, error: ErrorClass, *, sent_at: int, latency: int
) -> tuple[bytes, bytes, list[tuple[str, bytes]], int]:
    request_record = encode_request(
        {"features": np.zeros((1, 3), np.float32)},
        correlation_id=correlation_id,
        extra_headers=[("sent-at-ms", str(sent_at).encode())],
    )
    headers = dead_letter_headers(
        request_record.headers,
        stage="classify",
        error_class=error,
        reason="features: wrong shape [1, 3]",
        now_ms=sent_at + latency,
    )
    assert request_record.key is not None
    return request_record.key, request_record.value, headers, sent_at + latency


@pytest.mark.kafka
def test_consume_prints_results_dead_letters_and_an_exact_summary(
    kafka_bootstrap: str, cli_env: dict[str, str]
) -> None:
    topic = new_topic("summary")
    t0 = int(time.time() * 1000) - 60_000
    records = [
        _result("r-1", key="k", sent_at=t0, latency=10, logits=[0.5, -1.0, 2.0, 0.0]),
        _result("r-2", key="k", sent_at=t0 + 100, latency=20, logits=[1.0, 1.0, 1.0, 1.0]),
        # Same key, sent earlier than r-2 yet stored after it: one ordering finding.
        _result("r-3", key="k", sent_at=t0 + 50, latency=30, logits=[0.0, 0.0, 0.0, 1.0]),
        # A result delivered twice (at-least-once after a crash): one duplicate.
        _result("r-1", key="k", sent_at=t0 + 200, latency=40, logits=[0.5, -1.0, 2.0, 0.0]),
        _dead_letter("d-1", ErrorClass.SHAPE_MISMATCH, sent_at=t0 + 300, latency=50),
        _dead_letter("d-2", ErrorClass.DATATYPE_MISMATCH, sent_at=t0 + 400, latency=60),
        _dead_letter("d-3", ErrorClass.SHAPE_MISMATCH, sent_at=t0 + 500, latency=70),
    ]
    asyncio.run(_send_all(kafka_bootstrap, topic, records))

    lines, summary = consume_json(cli_env, topic, len(records))
    assert [line["kind"] for line in lines] == ["result"] * 4 + ["dead-letter"] * 3
    first = lines[0]
    assert first["correlation_id"] == "r-1" and first["key"] == "k"
    assert first["model_name"] == "dense_classifier" and first["model_version"] == "1"
    assert first["outputs"] == {
        "logits": {
            "datatype": "FP32",
            "shape": [1, 4],
            "values": [0.5, -1.0, 2.0, 0.0],
            "truncated": False,
        }
    }
    assert first["latency_ms"] == 10 and header(first, "x-app") == "kept"
    assert lines[4]["error_class"] == "shape-mismatch" and lines[4]["error_stage"] == "classify"
    assert lines[4]["error_reason"] == "features: wrong shape [1, 3]"
    assert summary["records"] == 7 and summary["results"] == 4 and summary["dead_letters"] == 3
    assert summary["dead_letters_by_class"] == {"datatype-mismatch": 1, "shape-mismatch": 2}
    assert summary["distinct_correlation_ids"] == 6 and summary["duplicates"] == 1
    assert summary["latency_ms"] == {"count": 7, "p50": 40, "p90": 70, "p99": 70, "max": 70}
    assert summary["out_of_order"] == 1
    assert summary["stopped_by"] == "count"

    # The same, for people: one plain line per record, then the summary.
    shown = ok(
        run_cli(
            cli_env,
            "consume",
            "--topic",
            topic,
            "--from-beginning",
            "--count",
            "7",
            "--timeout",
            "30",
        )
    )
    out = shown.stdout.splitlines()
    assert (
        out[0].startswith("result")
        and "id=r-1" in out[0]
        and "logits FP32 [1, 4] [0.5, -1, 2, 0]" in out[0]
    )
    assert (
        out[4].startswith("dead-letter")
        and "shape-mismatch: features: wrong shape [1, 3] (stage classify)" in out[4]
    )
    summary_text = fields("\n".join(out[7:]))
    assert summary_text["dead letters"] == "3 (datatype-mismatch 1, shape-mismatch 2)"
    assert summary_text["correlation ids"] == "6 distinct, 1 duplicates"
    assert summary_text["latency"] == "p50 40 ms, p90 70 ms, p99 70 ms, max 70 ms (7 records)"
    assert summary_text["ordering"] == "1 out of order within a key"

    quiet = ok(
        run_cli(
            cli_env, "consume", "--topic", topic, "--from-beginning", "--quiet", "--timeout", "3"
        )
    )
    assert fields(quiet.stdout)["records"] == "7" and "stopped after 3 s" in quiet.stderr


@pytest.mark.kafka
def test_follow_from_latest_sees_only_new_records_and_stops_on_ctrl_c(
    kafka_bootstrap: str, cli_env: dict[str, str]
) -> None:
    topic = new_topic("latest")

    def send_result(name: str, logit: int) -> None:
        now = int(time.time() * 1000)
        record = _result(name, key=name, sent_at=now, latency=1, logits=[logit] * 4)
        asyncio.run(_send_all(kafka_bootstrap, topic, [record]))

    send_result("old", 0)
    command = [sys.executable, "-m", "pipeline", "consume", "--topic", topic, "--json", "--follow"]
    process = subprocess.Popen(
        command, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        ready = ""
        while not ready.startswith("consuming"):  # printed once positions are resolved
            ready = process.stderr.readline()
            assert ready, "consume exited before it was ready"
        assert ready.startswith(f"consuming {topic}") and "until Ctrl-C" in ready, ready
        send_result("new", 1)
        first = json.loads(process.stdout.readline())  # flushed per record, so it arrives now
        assert first["correlation_id"] == "new"
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    (summary,) = (json.loads(line) for line in stdout.splitlines())
    assert (
        summary["kind"] == "summary"
        and summary["results"] == 1
        and summary["stopped_by"] == "signal"
    )


@pytest.mark.kafka
@pytest.mark.slow
def test_group_commits_what_it_consumed(cli_env: dict[str, str], tmp_path: Path) -> None:
    topic = new_topic("group")
    group = f"g-{topic}"
    source = tmp_path / "request.json"
    source.write_text('{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}')
    produce(cli_env, "--topic", topic, "--json", str(source), "--count", "5", "--key", "same")

    def consume_in_group(*until: str) -> list[dict[str, Any]]:
        args = ["--topic", topic, "--group", group, "--from-beginning", "--json", *until]
        return [
            json.loads(line) for line in ok(run_cli(cli_env, "consume", *args)).stdout.splitlines()
        ]

    seen = consume_in_group("--count", "2") + consume_in_group("--timeout", "3")
    offsets = [line["offset"] for line in seen if line["kind"] != "summary"]
    assert offsets == [0, 1, 2, 3, 4]  # one key, one partition: the second run resumes at 2
    # Without a group nothing was committed by anyone else: every record is still there.
    _, summary = consume_json(cli_env, topic, 5)
    assert summary["requests"] == 5


# --------------------------------------------------------------------------- no services


def _write_wav(
    path: Path, *, format_tag: int, channels: int, rate: int, bits: int, payload: bytes
) -> None:
    """A minimal RIFF/WAVE file (``wave`` cannot write float or 24-bit-extensible headers)."""
    import struct

    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", format_tag, channels, rate, rate * block, block, bits)
    body = (
        b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(payload))
        + payload
    )
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


def test_wav_reader_float_stereo_and_pcm24(tmp_path: Path) -> None:
    stereo = np.array([[0.5, -0.5], [0.25, 0.75], [-1.0, 1.0]], np.float32)
    _write_wav(
        tmp_path / "f.wav", format_tag=3, channels=2, rate=16000, bits=32, payload=stereo.tobytes()
    )
    audio = read_wav(tmp_path / "f.wav")
    assert (audio.sample_rate, audio.channels, audio.source_format) == (16000, 2, "FP32")
    np.testing.assert_array_equal(audio.mono(), np.array([0.0, 0.5, 0.0], np.float32))
    assert [c.tolist() for c in audio.chunks(2)] == [[0.0, 0.5], [0.0, 0.0]]

    samples = [0, 1 << 22, -(1 << 23)]
    payload = b"".join(v.to_bytes(3, "little", signed=True) for v in samples)
    _write_wav(tmp_path / "p24.wav", format_tag=1, channels=1, rate=8000, bits=24, payload=payload)
    np.testing.assert_array_equal(
        read_wav(tmp_path / "p24.wav").mono(), np.array([0.0, 0.5, -1.0], np.float32)
    )


def test_pacer_keeps_the_average_rate_despite_sleep_overshoot() -> None:
    clock = [0.0]

    async def late_sleep(delay: float) -> None:
        clock[0] += (
            delay + 0.001
        )  # every sleep overshoots by a millisecond, like the event loop's timer

    async def run() -> None:
        pacer = Pacer(2000, clock=lambda: clock[0], sleep=late_sleep)
        for _ in range(2001):
            await pacer.wait()

    asyncio.run(run())
    # 2000 intervals of 0.5 ms: 1 s. Naive sleeping would take 2000 * 1.5 ms = 3 s.
    assert 1.0 <= clock[0] < 1.01


def test_consume_reads_one_partition_from_an_offset_like_the_console_consumer(
    kafka_bootstrap: str, cli_env: dict[str, str]
) -> None:
    """``--partition`` and ``--offset`` (kafka-console-consumer's) assign, seek and read, no group."""
    topic = f"assigned-{uuid.uuid4().hex[:8]}"

    asyncio.run(fill_two_partitions(kafka_bootstrap, topic))
    args = ["--topic", topic, "--partition", "1", "--offset", "3", "--max-messages", "2", "--json", "--timeout", "10"]
    out = run_cli(cli_env, "consume", "-b", kafka_bootstrap, *args)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(text) for text in out.stdout.splitlines()]
    records = [line for line in lines if "offset" in line]
    assert [(r["partition"], r["offset"]) for r in records] == [(1, 3), (1, 4)], lines
