"""TLS on Triton's gRPC port, end to end, against a real tritonserver.

A second embedded Triton, serving the session's S3 model store, listens for
gRPC only over TLS with a certificate from a CA made here. Clients built by
:mod:`pipeline.triton.client` must reach it with that CA, must be refused
without TLS or with another CA (quickly, with one line), and `pipeline run`
on ``topologies/dense.yaml`` must serve a stream through it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from pipeline.embedded.services import TlsFiles
from pipeline.embedded.stack import EmbeddedStack
from pipeline.errors import EndpointUnreachable
from pipeline.settings import S3Settings, TritonSettings
from pipeline.triton.admin import TritonAdmin
from pipeline.triton.client import grpc_target
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.kafka_io import header, produce
from tests.helpers.tls_certs import issue, make_ca, server_tls_files, write_cert, write_key
from tests.helpers.topology_process import collect_outputs, pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.s3, pytest.mark.slow]

DENSE_TOPOLOGY = Path(__file__).resolve().parents[2] / "topologies" / "dense.yaml"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return server_tls_files(tmp_path_factory.mktemp("triton-tls"))


@pytest.fixture(scope="module")
def tls_triton(
    s3_settings: S3Settings, tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonSettings]:
    """A Triton of this module's own whose gRPC port speaks only TLS."""
    stack = EmbeddedStack(
        services=("triton",),
        s3=s3_settings,
        log_dir=tmp_path_factory.mktemp("tls-triton-logs"),
        triton_tls=tls_files,
    )
    stack.start()
    try:
        yield stack.endpoints.triton
    finally:
        stack.stop()


def _settings(url: str, root_cert: Path | None = None) -> TritonSettings:
    """Explicit settings, so no PIPELINE_TRITON_SSL_* in the environment can change them."""
    return TritonSettings(
        grpc_url=url, ssl=False, ssl_root_cert=root_cert, ssl_client_key=None, ssl_client_cert=None
    )


def test_admin_reaches_triton_over_tls_with_its_ca(
    tls_triton: TritonSettings, tls_files: TlsFiles
) -> None:
    assert tls_triton.grpc_url and tls_triton.grpc_url.startswith("grpcs://")
    with TritonAdmin(_settings(tls_triton.grpc_url, tls_files.ca_cert)) as admin:
        admin.wait_ready(timeout=30)
        assert admin.is_ready()
        assert admin.describe("dense_classifier").max_batch_size == 64


def test_plaintext_client_is_refused_quickly(tls_triton: TritonSettings) -> None:
    assert tls_triton.grpc_url
    host_port, _ = grpc_target(tls_triton.grpc_url)
    started = time.monotonic()
    with (
        TritonAdmin(_settings(host_port), timeout=5) as admin,
        pytest.raises(EndpointUnreachable) as refused,
    ):
        admin.ping()
    assert time.monotonic() - started < 10, "a plaintext client must fail, not hang"
    message = str(refused.value)
    assert "\n" not in message and host_port in message
    assert "grpcs://" in message, "the error should hint at TLS"


def test_wrong_ca_fails_with_one_line_naming_the_certificate(
    tls_triton: TritonSettings, tmp_path: Path
) -> None:
    assert tls_triton.grpc_url
    other_ca = write_cert(tmp_path / "other-ca.pem", make_ca("some other CA"))
    started = time.monotonic()
    with (
        TritonAdmin(_settings(tls_triton.grpc_url, other_ca), timeout=5) as admin,
        pytest.raises(EndpointUnreachable) as refused,
    ):
        admin.ping()
    assert time.monotonic() - started < 10
    message = str(refused.value)
    assert "\n" not in message
    assert "CERTIFICATE_VERIFY_FAILED" in message or "certificate" in message.lower(), message


def test_mutual_tls_needs_the_client_certificate(s3_settings: S3Settings, tmp_path: Path) -> None:
    client_ca = make_ca("pipeline client CA")
    client = issue(client_ca, "pipeline-worker", server=False)
    client_ca_file = write_cert(tmp_path / "client-ca.pem", client_ca)
    files = server_tls_files(tmp_path / "pki", client_ca=client_ca_file)
    key = write_key(tmp_path / "client.key", client)
    cert = write_cert(tmp_path / "client.pem", client)
    with EmbeddedStack(
        services=("triton",), s3=s3_settings, log_dir=tmp_path / "logs", triton_tls=files
    ) as stack:
        url = stack.endpoints.triton.grpc_url
        assert url
        with_cert = _settings(url, files.ca_cert).model_copy(
            update={"ssl_client_key": key, "ssl_client_cert": cert}
        )
        with TritonAdmin(with_cert) as admin:
            admin.wait_ready(timeout=30)
            assert admin.describe("dense_classifier").max_batch_size == 64
        with (
            TritonAdmin(_settings(url, files.ca_cert), timeout=5) as admin,
            pytest.raises(EndpointUnreachable) as refused,
        ):
            admin.ping()
        assert "\n" not in str(refused.value)


def test_dense_topology_runs_end_to_end_through_tls_triton(
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tls_triton: TritonSettings,
    tls_files: TlsFiles,
    tmp_path: Path,
) -> None:
    # topologies/dense.yaml's stage, kafka and triton sections, under this test's own topics.
    dense = yaml.safe_load(DENSE_TOPOLOGY.read_text())
    topo = write_topology(
        tmp_path,
        partitions=dense["kafka"]["partitions"],
        stages=dense["stages"],
        # ${KAFKA_BOOTSTRAP:-} and ${TRITON_URL:-} are unset: the environment decides.
        extra={"kafka": dense["kafka"], "triton": dense["triton"]},
    )
    assert tls_triton.grpc_url
    env = dict(
        cli_env,
        PIPELINE_TRITON_GRPC_URL=tls_triton.grpc_url,
        PIPELINE_TRITON_SSL_ROOT_CERT=str(tls_files.ca_cert),
    )
    for name in ("KAFKA_BOOTSTRAP", "TRITON_URL", "PIPELINE_TRITON_SSL",
                 "PIPELINE_TRITON_SSL_CLIENT_KEY", "PIPELINE_TRITON_SSL_CLIENT_CERT"):
        env.pop(name, None)
    n = 200
    features = random_features(n, seed=11)
    records = [
        encode_request({"features": features[i : i + 1]}, correlation_id=f"tls-{i}")
        for i in range(n)
    ]
    with pipeline_process(topo, env, tmp_path) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        out = collect_outputs(kafka_bootstrap, topo, done=lambda rs: len(rs) >= n, timeout=120)
        assert worker.terminate(timeout=60) == 0, worker.log()

    assert out.on(topo.dead_letter_topic) == []
    seen: set[str] = set()
    for record in out.on(topo.result_topic):
        response = decode_response(record.value, record.headers)
        cid = response.correlation_id
        assert header(record, "model-name") == "dense_classifier"
        index = int(cid.removeprefix("tls-"))
        np.testing.assert_allclose(
            response.outputs["logits"],
            mlp_reference(features[index : index + 1]),
            rtol=1e-4,
            atol=1e-5,
        )
        seen.add(cid)
    assert seen == {f"tls-{i}" for i in range(n)}
