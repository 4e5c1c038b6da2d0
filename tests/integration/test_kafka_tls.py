"""Transport security against real servers: Kafka over TLS, the S3 model store over HTTPS.

Kafka: an Apache Kafka of this module's own whose only client listener is TLS
(``tests/helpers/secure_kafka.py``: ``BrokerSecurity(sasl=False)``; it advertises that
listener only, so every connection after bootstrap is TLS too). With the CA that signed its
certificate, `pipeline run` serves a topology end to end; with an unrelated CA, `pipeline
run`, `produce` and `consume` exit 1 with one line naming the certificate failure.

S3: moto's own HTTPS listener with a certificate from a CA made here; the `minio`
client path (`pipeline models push` / `list`) verifies it against
``PIPELINE_S3_CA_FILE`` and refuses another CA in one line.

Triton over TLS is covered by ``test_triton_tls.py``; SASL/SCRAM, mutual TLS and ACLs on the
same broker by ``test_kafka_acls.py``. (Tansu has no TLS of its own; these tests once put
stunnel in front of it.)
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import SecretStr

from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from pipeline.embedded.process import SupervisedProcess, free_port
from pipeline.embedded.services import TlsFiles, s3_process
from pipeline.errors import EndpointUnreachable
from pipeline.modelstore.store import ModelStore
from pipeline.settings import Endpoints, S3Settings
from tests.helpers.cli import assert_one_line_error, ok, run_cli
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.kafka_io import collect, header, produce
from tests.helpers.secure_kafka import TlsKafka, tls_kafka
from tests.helpers.tls_certs import make_ca, server_tls_files, write_cert
from tests.helpers.topology_process import pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.s3, pytest.mark.slow]

SAMPLE_MODELS = Path(__file__).resolve().parents[2] / "sample_models"
#: Variables of the session's environment that would point a `pipeline` process elsewhere.
_FOREIGN = ("KAFKA_BOOTSTRAP_SERVERS", "PIPELINE_KAFKA_SASL_MECHANISM", "PIPELINE_KAFKA_SASL_USERNAME",
            "PIPELINE_KAFKA_SASL_PASSWORD", "PIPELINE_KAFKA_SSL_CERTFILE", "PIPELINE_KAFKA_SSL_KEYFILE",
            "SSL_CERT_FILE")


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsKafka]:
    with tls_kafka(tmp_path_factory.mktemp("kafka-tls")) as kafka:
        yield kafka


@pytest.fixture(scope="module")
def wrong_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA certificate that signed nothing any server here presents."""
    return write_cert(tmp_path_factory.mktemp("other-ca") / "ca.pem", make_ca("some other CA"))


def _env(base: dict[str, str], **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in _FOREIGN}
    env.update(overrides)
    return env


# --------------------------------------------------------------------------- Kafka


def test_broker_is_advertised_only_behind_tls(tls_broker: TlsKafka) -> None:
    """Every broker address a client learns from metadata is stunnel's TLS port."""

    async def brokers() -> list[tuple[str, int]]:
        admin = AIOKafkaAdminClient(**tls_broker.settings(tls_broker.tls.ca_cert).client_kwargs())
        await admin.start()
        try:
            cluster = await admin.describe_cluster()
        finally:
            await admin.close()
        return [(b["host"], b["port"]) for b in cluster["brokers"]]

    host, port = tls_broker.bootstrap.rsplit(":", 1)
    assert asyncio.run(brokers()) == [(host, int(port))]


def test_topology_runs_end_to_end_over_tls(
    tls_broker: TlsKafka, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_topology(tmp_path, partitions=2)
    env = _env(cli_env, **tls_broker.environment(tls_broker.tls.ca_cert))
    assert env["PIPELINE_KAFKA_SECURITY_PROTOCOL"] == "SSL"
    client = tls_broker.settings(tls_broker.tls.ca_cert)
    n = 60
    features = random_features(n, seed=23)
    records = [encode_request({"features": features[i : i + 1]}, correlation_id=f"ktls-{i}") for i in range(n)]
    with pipeline_process(topo, env, tmp_path) as worker:
        asyncio.run(produce(client, topo.input_topic, records))
        out = asyncio.run(
            collect(client, [topo.result_topic, topo.dead_letter_topic], done=lambda rs: len(rs) >= n, timeout=120)
        )
        assert worker.terminate(timeout=60) == 0, worker.log()

    assert out.on(topo.dead_letter_topic) == []
    results = out.on(topo.result_topic)
    assert len(results) == n
    for record in results:
        response = decode_response(record.value, record.headers)
        index = int(response.correlation_id.removeprefix("ktls-"))
        assert header(record, "model-name") == "dense_classifier"
        np.testing.assert_allclose(
            response.outputs["logits"], mlp_reference(features[index : index + 1]), rtol=1e-4, atol=1e-5
        )
    assert {decode_response(r.value, r.headers).correlation_id for r in results} == {f"ktls-{i}" for i in range(n)}


def test_wrong_ca_is_refused_with_one_line(
    tls_broker: TlsKafka, wrong_ca: Path, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_topology(tmp_path)
    env = _env(cli_env, **tls_broker.environment(wrong_ca))
    request = tmp_path / "request.json"
    request.write_text(json.dumps(
        {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
    ))
    expected = f"TLS certificate verification failed for {tls_broker.bootstrap}: unable to get local issuer certificate"
    for command in (
        ["run", str(topo.path)],
        ["produce", "--topic", topo.input_topic, "--json", str(request)],
        ["consume", "--topic", topo.result_topic, "--count", "1", "--timeout", "5"],
    ):
        started = time.monotonic()
        line = assert_one_line_error(run_cli(env, *command, timeout=60), expected)
        assert time.monotonic() - started < 30, f"{command[0]} must fail fast, not retry"
        assert line.startswith(f"error: cannot reach Kafka at {tls_broker.bootstrap}: "), line
        assert str(wrong_ca) in line, "the line names the CA file that was used"


def test_plaintext_client_cannot_use_the_tls_port(tls_broker: TlsKafka, cli_env: dict[str, str]) -> None:
    """No TLS configured: refused in one line (nothing reaches the broker in clear)."""
    env = _env(cli_env, PIPELINE_KAFKA_BOOTSTRAP_SERVERS=tls_broker.bootstrap, PIPELINE_KAFKA_SECURITY_PROTOCOL="PLAINTEXT")
    result = run_cli(env, "consume", "--topic", "nothing-here", "--count", "1", "--timeout", "5", timeout=60)
    assert_one_line_error(result, f"cannot reach Kafka at {tls_broker.bootstrap}")


# --------------------------------------------------------------------------- S3 over HTTPS


@pytest.fixture(scope="module")
def https_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Settings, TlsFiles]]:
    """moto serving S3 over HTTPS only, with a certificate from this module's own CA."""
    work = tmp_path_factory.mktemp("s3-https")
    tls = server_tls_files(work / "pki")
    port = free_port()
    server: SupervisedProcess = s3_process(port, work, tls=tls)
    server.start()
    try:
        settings = S3Settings(
            endpoint=f"https://127.0.0.1:{port}",
            bucket="secure-models",
            access_key=SecretStr(secrets.token_hex(8)),  # moto accepts any; never a literal
            secret_key=SecretStr(secrets.token_hex(16)),
            ca_file=tls.ca_cert,
        )
        yield settings, tls
    finally:
        server.stop()


def _s3_env(base: dict[str, str], settings: S3Settings, ca_file: Path) -> dict[str, str]:
    """The session's environment pointed at the HTTPS store, trusting ``ca_file``."""
    store = Endpoints(s3=settings.model_copy(update={"ca_file": ca_file})).environment()
    env = _env(base, **{k: v for k, v in store.items() if k.startswith(("PIPELINE_S3_", "AWS_"))})
    env.pop("PIPELINE_TRITON_GRPC_URL", None)  # store only: nothing here may fall back to Triton
    return env


def test_models_push_and_list_over_https(
    https_s3: tuple[S3Settings, TlsFiles], cli_env: dict[str, str]
) -> None:
    settings, tls = https_s3
    assert tls.ca_cert is not None
    env = _s3_env(cli_env, settings, tls.ca_cert)
    ok(run_cli(env, "models", "push", str(SAMPLE_MODELS), "--model", "dense_classifier"))
    listing = json.loads(ok(run_cli(env, "models", "list", "--json")).stdout)
    rows = {row["name"]: row for row in listing["models"]}
    assert rows["dense_classifier"]["in_store"] and rows["dense_classifier"]["versions"] == [1]
    # What the CLI listed is really in the bucket, read back over HTTPS by the library path.
    stored = {m.name: m for m in ModelStore(settings).list_models()}
    assert stored["dense_classifier"].versions == [1] and stored["dense_classifier"].files >= 2


def test_s3_wrong_ca_is_refused_with_one_line(
    https_s3: tuple[S3Settings, TlsFiles], wrong_ca: Path, cli_env: dict[str, str]
) -> None:
    settings, _ = https_s3
    env = _s3_env(cli_env, settings, wrong_ca)
    line = assert_one_line_error(run_cli(env, "models", "list", timeout=60), f"cannot reach S3 at {settings.endpoint}")
    assert "CERTIFICATE_VERIFY_FAILED" in line, line
    with pytest.raises(EndpointUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
        ModelStore(settings.model_copy(update={"ca_file": wrong_ca})).list_models()
