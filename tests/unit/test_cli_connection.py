"""``-b``/``-X``/``--kafka-config`` reach the Kafka client; a wrong key is one line; ``produce -``
reads stdin; ``--no-embedded`` refuses the embedded stack.

Why: these flags are how a Kafka user points the CLI at a real cluster; a key
silently dropped (``security.protocol``) would send credentials in clear text,
and a silent fall-back to a local throwaway stack hides a missing variable.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli.connection import Flags, endpoints_text
from pipeline.cli.kafka_props import parse_properties
from pipeline.endpoints import resolve_endpoints
from pipeline.errors import ConfigError
from pipeline.settings import KafkaSettings
from tests.helpers.cli import assert_one_line_error


def _isolated_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment without any endpoint, and a state dir of its own (no embedded stack)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIPELINE_", "AWS_", "KAFKA_"))}
    return {**env, "PIPELINE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200", "NO_COLOR": "1", **extra}


def _cli(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], input=stdin, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def clean_kafka_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(("PIPELINE_KAFKA_", "KAFKA_")):
            monkeypatch.delenv(name)
    return monkeypatch


def test_bootstrap_and_properties_reach_the_client_kwargs(clean_kafka_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    file_secret, flag_secret = secrets.token_hex(8), secrets.token_hex(8)
    config = tmp_path / "client.properties"
    config.write_text(
        "# Java client properties\n"
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism : SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        f'    username="alice" password="{file_secret}";\n'
        "client.id=from-file\n"
    )
    flags = Flags(
        bootstrap_server="broker-1:9092,broker-2:9092",
        kafka_property=("client.id=from-x", f"sasl.password={flag_secret}"),
        kafka_config=config,
    )
    for name, value in flags.environment().items():
        clean_kafka_env.setenv(name, value)
    kwargs = KafkaSettings().client_kwargs()
    assert kwargs["bootstrap_servers"] == "broker-1:9092,broker-2:9092"
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "alice"
    assert kwargs["sasl_plain_password"] == flag_secret  # -X wins over the file
    assert kwargs["client_id"] == "from-x"


def test_librdkafka_names_map_to_settings() -> None:
    env = Flags(
        kafka_property=(
            "metadata.broker.list=b:9092",
            "security.protocol=ssl",
            "ssl.ca.location=/ca.pem",
            "ssl.certificate.location=/c.pem",
            "ssl.key.location=/k.pem",
            "sasl.mechanisms=PLAIN",
            "sasl.username=bob",
        )
    ).environment()
    assert env == {
        "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": "b:9092",
        "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SSL",
        "PIPELINE_KAFKA_SSL_CAFILE": "/ca.pem",
        "PIPELINE_KAFKA_SSL_CERTFILE": "/c.pem",
        "PIPELINE_KAFKA_SSL_KEYFILE": "/k.pem",
        "PIPELINE_KAFKA_SASL_MECHANISM": "PLAIN",
        "PIPELINE_KAFKA_SASL_USERNAME": "bob",
    }


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ("secuirty.protocol=SSL", "unknown Kafka property 'secuirty.protocol' (did you mean 'security.protocol'?)"),
        ("ssl.ca.locaton=/x", "did you mean 'ssl.ca.location'?"),
        ("security.protocol=TLS", "Kafka property security.protocol='TLS'"),
        ("sasl.password", "expected key=value"),
        ("ssl.truststore.location=/t.jks", "Java keystores are not read here"),
    ],
)
def test_a_wrong_property_is_a_config_error(item: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        Flags(kafka_property=(item,)).environment()
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_a_secret_value_is_not_echoed_in_the_error() -> None:
    secret = secrets.token_hex(8)
    with pytest.raises(ConfigError) as error:
        Flags(kafka_property=("sasl.mechanism=NOPE", f"sasl.password={secret}")).environment()
    assert secret not in str(error.value)


def test_properties_file_format() -> None:
    text = "! comment\n# comment\n\nkey1=value 1\nkey2: two\nkey3 three\nlong=a\\\n   b\n"
    assert parse_properties(text, "f") == [("key1", "value 1"), ("key2", "two"), ("key3", "three"), ("long", "ab")]


def test_wrong_x_key_on_the_command_line_is_one_line(tmp_path: Path) -> None:
    result = _cli(_isolated_env(tmp_path), "consume", "--topic", "t", "-X", "client.idd=me")
    assert_one_line_error(result, "unknown Kafka property 'client.idd' (did you mean 'client.id'?)")


def test_produce_reads_stdin(tmp_path: Path) -> None:
    """`--json -` reads standard input: a broken request there is reported as <stdin>'s."""
    env = _isolated_env(tmp_path)
    broken = _cli(env, "produce", "-b", "127.0.0.1:1", "--topic", "t", "--json", "-", stdin='{"inputs": [\n')
    assert_one_line_error(broken, "<stdin>:2: invalid JSON")
    request = {"inputs": [{"name": "features", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]}
    sent = _cli(env, "produce", "-b", "127.0.0.1:1", "--topic", "t", "--json", "-", stdin=json.dumps(request))
    assert_one_line_error(sent, "cannot reach Kafka at 127.0.0.1:1")  # read, parsed, then sent


def _fake_stack(tmp_path: Path) -> None:
    """A state file naming a live process (this one), as a running `pipeline up` leaves it."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    environment = {"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "PIPELINE_TRITON_GRPC_URL": "127.0.0.1:9"}
    (state / "stack.json").write_text(json.dumps({"pid": os.getpid(), "environment": environment, "log_dir": "/x"}))


def test_no_embedded_refuses_a_running_embedded_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_stack(tmp_path)
    for name in list(os.environ):
        if name.startswith(("PIPELINE_", "KAFKA_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIPELINE_STATE_DIR", str(tmp_path / "state"))
    assert resolve_endpoints(need=("kafka",)).kafka.bootstrap_servers == "127.0.0.1:9"
    monkeypatch.setenv("PIPELINE_NO_EMBEDDED", "1")
    with pytest.raises(ConfigError, match="embedded stack is refused"):
        resolve_endpoints(need=("kafka",))


def test_no_embedded_flag_and_variable_on_the_command_line(tmp_path: Path) -> None:
    _fake_stack(tmp_path)
    env = _isolated_env(tmp_path)
    flag = _cli(env, "consume", "--topic", "t", "--no-embedded")
    assert_one_line_error(flag, "no kafka endpoint configured and the embedded stack is refused")
    variable = _cli({**env, "PIPELINE_NO_EMBEDDED": "1"}, "models", "inspect", "m")
    assert_one_line_error(variable, "no triton endpoint configured and the embedded stack is refused")


def test_endpoints_line_names_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_KAFKA_BOOTSTRAP_SERVERS", "k:9092")
    text = endpoints_text(kafka=KafkaSettings())
    assert text == "endpoints: kafka k:9092 (PIPELINE_KAFKA_BOOTSTRAP_SERVERS)"


def test_endpoints_line_comes_before_anything_else_on_stderr() -> None:
    import io

    from pipeline.cli.connection import EndpointsFirst, announce, drop_endpoints_line

    stream = io.StringIO()
    wrapped = EndpointsFirst(stream)
    announce("endpoints: kafka k:9092 (flag)")
    wrapped.write("consuming t\n")
    wrapped.write("more\n")
    assert stream.getvalue().splitlines() == ["endpoints: kafka k:9092 (flag)", "consuming t", "more"]
    announce("endpoints: kafka k:9092 (flag)")
    assert drop_endpoints_line() == "endpoints: kafka k:9092 (flag)"  # a failing command: the error alone


def test_offset_forms() -> None:
    from pipeline.tools.consumer import StartAt

    now = 1_700_000_000_000
    assert StartAt.parse("beginning", now_ms=now) == StartAt("beginning")
    assert StartAt.parse("end", now_ms=now) == StartAt("end")
    assert StartAt.parse("42", now_ms=now) == StartAt("offset", 42)
    assert StartAt.parse("-10", now_ms=now) == StartAt("offset", -10)
    assert StartAt.parse("10m", now_ms=now) == StartAt("time", now - 600_000)
    with pytest.raises(ConfigError):
        StartAt.parse("yesterday-ish", now_ms=now)
