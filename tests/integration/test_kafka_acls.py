"""Least privilege enforced by the broker: SASL/SCRAM-SHA-512 over TLS and ACLs on real Apache Kafka.

One embedded Apache Kafka (``tests/helpers/secure_kafka.py``) authenticates every client
(SCRAM-SHA-512 over TLS, no unauthenticated port) and authorizes every request
(``StandardAuthorizer``, nothing allowed without an ACL). Two topologies of one stage each
run their stage under its own principal, with exactly the ACLs ``pipeline deploy acls
--apply`` creates; two clients, ``alice`` and ``bob``, get a client's ACLs.

What the broker must then refuse, each in one line naming what was refused: a stage run
under the other stage's principal, a client reading another client's reply topic, a wrong
password, a CA that did not sign the broker's certificate. No password may appear in any
output or log.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pipeline.client import Client, RequestTimedOut
from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from pipeline.deploy.access import client_reply_topic
from pipeline.deploy.kafka_acls import topology_grants, unit_user
from pipeline.embedded.kafka_security import SUPER_USER
from pipeline.kafka.acl_admin import AclBinding, create_acls
from pipeline.kafka.clients import ensure_topics
from pipeline.topology.loader import load_topology
from tests.helpers.cli import assert_one_line_error, ok, run_cli
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.kafka_io import collect, header, produce
from tests.helpers.secure_kafka import SecureKafka, client_certificates, other_ca, secure_kafka
from tests.helpers.topology_process import PipelineProcess, TopologyFiles, pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

#: Variables of the session's environment that would log a `pipeline` process in elsewhere.
_FOREIGN = ("KAFKA_BOOTSTRAP_SERVERS", "PIPELINE_KAFKA_SSL_CERTFILE", "PIPELINE_KAFKA_SSL_KEYFILE", "SSL_CERT_FILE")
CLIENTS = ("alice", "bob")


@dataclass(frozen=True)
class Secured:
    kafka: SecureKafka
    first: TopologyFiles
    second: TopologyFiles
    transactional: TopologyFiles
    """A third topology, with ``delivery: exactly_once``."""
    outputs: list[str]
    """Every output of every command and process of this module, for the leak check."""
    broker_logs: Path

    def unit(self, topology: TopologyFiles) -> str:
        return unit_user(load_topology(topology.path), "classify")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, cli_env: dict[str, str]) -> Iterator[Secured]:
    """The broker, both topologies' topics made by the admin, and every ACL applied."""
    work = tmp_path_factory.mktemp("kafka-acls")
    first, second = write_topology(work, partitions=2), write_topology(work, partitions=2)
    transactional = write_topology(work, partitions=2, extra={"delivery": "exactly_once"})
    units = [unit_user(load_topology(t.path), "classify") for t in (first, second, transactional)]
    with secure_kafka(work, [*units, *CLIENTS]) as kafka:
        outputs: list[str] = []
        for topo in (first, second, transactional):
            topology = load_topology(topo.path)
            asyncio.run(ensure_topics(kafka.admin(), topology.topics(), partitions=2))
            asyncio.run(ensure_topics(kafka.admin(), [client_reply_topic(topology, c) for c in CLIENTS], partitions=1))
            args = ["deploy", "acls", str(topo.path), *(f"--client={c}" for c in CLIENTS), "--apply"]
            applied = ok(run_cli(_env(cli_env, kafka, "admin"), *args))
            outputs += [applied.stdout, applied.stderr]
            expected = sum(len(g.bindings()) for g in topology_grants(topology, CLIENTS))
            assert f"created {expected} ACL bindings for 3 principals" in applied.stdout + applied.stderr
        yield Secured(kafka, first, second, transactional, outputs, work / "logs")


def _env(base: dict[str, str], kafka: SecureKafka, user: str, **options: object) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in _FOREIGN and not k.startswith("PIPELINE_KAFKA_")}
    env.update(kafka.environment(user, **options))  # type: ignore[arg-type]
    return env


def test_each_stage_and_client_works_with_exactly_its_acls(
    secured: Secured, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The stage under its own principal serves alice's calls on alice's reply topic."""
    topo = secured.first
    env = _env(cli_env, secured.kafka, secured.unit(topo))
    n = 24
    features = random_features(n, seed=41)

    async def calls() -> list[np.ndarray]:
        alice = secured.kafka.settings("alice")
        reply = client_reply_topic(load_topology(topo.path), "alice")
        async with Client(topo.path, kafka=alice, reply_topic=reply, timeout=90) as client:
            results = await asyncio.gather(*(client.infer({"features": features[i : i + 1]}) for i in range(n)))
            # She may not read the dead letters (they hold others' requests): hers ends by its timeout.
            with pytest.raises(RequestTimedOut):
                await client.infer({"features": np.zeros((1, 3), np.float32)}, timeout=3, correlation_id="alice-bad")
        return [r.outputs["logits"] for r in results]

    with pipeline_process(topo, env, tmp_path) as worker:
        logits = asyncio.run(calls())
        assert worker.terminate(timeout=60) == 0, worker.log()
        secured.outputs.append(worker.log_path.read_text(errors="replace"))
    for i, got in enumerate(logits):
        np.testing.assert_allclose(got, mlp_reference(features[i : i + 1]), rtol=1e-4, atol=1e-5)
    dead = asyncio.run(
        collect(secured.kafka.admin(), [topo.dead_letter_topic], done=lambda rs: len(rs) >= 1, timeout=30)
    )
    assert [header(r, "correlation-id") for r in dead.on(topo.dead_letter_topic)] == ["alice-bad"], "its one outcome"


def test_a_stage_under_exactly_once_works_with_its_transactional_id_acls(
    secured: Secured, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Its transactional producers (``<group>.<partition>``) start under its own principal, which
    may write and describe only ids under its group's prefix; every request gets its result."""
    topo = secured.transactional
    env = _env(cli_env, secured.kafka, secured.unit(topo))
    n = 12
    features = random_features(n, seed=43)
    requests = [encode_request({"features": features[i : i + 1]}, correlation_id=f"eos-{i}") for i in range(n)]
    with pipeline_process(topo, env, tmp_path) as worker:
        asyncio.run(produce(secured.kafka.admin(), topo.input_topic, requests))
        found = asyncio.run(
            collect(secured.kafka.admin(), [topo.result_topic], done=lambda rs: len(rs) >= n, timeout=60)
        )
        assert worker.terminate(timeout=60) == 0, worker.log()
        secured.outputs.append(worker.log_path.read_text(errors="replace"))
    results = {
        header(r, "correlation-id"): decode_response(r.value or b"", r.headers) for r in found.on(topo.result_topic)
    }
    assert sorted(results) == sorted(f"eos-{i}" for i in range(n)), worker.log()
    for i in range(n):
        np.testing.assert_allclose(
            results[f"eos-{i}"].outputs["logits"], mlp_reference(features[i : i + 1]), rtol=1e-4, atol=1e-5
        )


def test_a_stage_under_another_stages_principal_is_refused_in_one_line(
    secured: Secured, cli_env: dict[str, str]
) -> None:
    """The second topology's stage, logged in as the first's: the broker refuses its reads."""
    topo, intruder = secured.second, secured.unit(secured.first)
    result = run_cli(_env(cli_env, secured.kafka, intruder), "run", str(topo.path), timeout=120)
    secured.outputs.extend([result.stdout, result.stderr])
    # A worker logs its start-up first; its failure is its last line, once, with no traceback.
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "Unclosed" not in result.stderr, "a refused stage closes its clients"
    line = result.stderr.strip().splitlines()[-1]
    assert line == (
        f"error: stage classify: not authorized: the broker refused User:{intruder} Read on topic "
        f"'{topo.input_topic}' (TopicAuthorizationFailedError); its ACLs: `pipeline deploy acls`"
    ), result.stderr
    assert result.stderr.count("not authorized: the broker refused") == 1
    # it may not create the topics either, and says so once before it fails
    assert result.stderr.count("not allowed to create or describe topics") == 1, result.stderr


def test_a_client_cannot_read_another_clients_reply_topic(secured: Secured, cli_env: dict[str, str]) -> None:
    alice_topic = client_reply_topic(load_topology(secured.first.path), "alice")
    bob = _env(cli_env, secured.kafka, "bob")
    result = run_cli(bob, "consume", "--topic", alice_topic, "--from-beginning", "--count", "1", "--timeout", "5")
    secured.outputs.extend([result.stdout, result.stderr])
    line = assert_one_line_error(result, alice_topic)
    assert "not authorized" in line and "Read" in line, line
    # nor change the ACLs: only the admin may
    grab = run_cli(bob, "deploy", "acls", str(secured.first.path), "--client", "bob", "--apply")
    secured.outputs.extend([grab.stdout, grab.stderr])
    line = assert_one_line_error(grab, "the broker refused to allow User:")
    assert "ClusterAuthorizationFailedError" in line, line
    # and alice reads her own
    own = run_cli(_env(cli_env, secured.kafka, "alice"), "consume", "--topic", alice_topic, "--timeout", "2")
    secured.outputs.extend([own.stdout, own.stderr])
    ok(own)


def test_a_wrong_password_and_a_wrong_ca_each_give_one_line(
    secured: Secured, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = secured.first
    wrong = secrets.token_urlsafe(12)
    bad_password = _env(cli_env, secured.kafka, "alice", password=wrong)
    bad_ca = _env(cli_env, secured.kafka, "alice", cafile=other_ca(tmp_path))
    for command in (["run", str(topo.path)], ["consume", "--topic", topo.result_topic, "--timeout", "3"]):
        result = run_cli(bad_password, *command, timeout=90)
        secured.outputs.extend([result.stdout, result.stderr])
        line = assert_one_line_error(result, "refused the SASL login of user 'alice' (SCRAM-SHA-512)")
        assert wrong not in line
        result = run_cli(bad_ca, *command, timeout=90)
        secured.outputs.extend([result.stdout, result.stderr])
        assert_one_line_error(result, "TLS certificate verification failed")


def test_mutual_tls_demands_a_client_certificate_signed_by_the_client_ca(
    tmp_path_factory: pytest.TempPathFactory, cli_env: dict[str, str]
) -> None:
    """The broker's ``mutual_tls`` option: with her certificate alice reads what her ACL allows;
    without one, or with one from another CA, she gets one line."""
    work = tmp_path_factory.mktemp("kafka-mtls")
    certificates = client_certificates(work / "clients", [SUPER_USER, "alice"])
    strangers = client_certificates(work / "strangers", ["alice"])
    topic = f"mtls-{secrets.token_hex(4)}"
    with secure_kafka(work, ["alice"], clients=certificates) as kafka:
        asyncio.run(ensure_topics(kafka.admin(), [topic], partitions=1))
        asyncio.run(create_acls(kafka.admin(), [AclBinding("User:alice", "topic", topic, "literal", "Read")]))
        consume = ["consume", "--topic", topic, "--from-beginning", "--timeout", "2"]
        with_certificate = _env(cli_env, kafka, "alice", certificate=certificates.issued["alice"])
        ok(run_cli(with_certificate, *consume))
        for certificate in (None, strangers.issued["alice"]):
            result = run_cli(_env(cli_env, kafka, "alice", certificate=certificate), *consume, timeout=60)
            line = assert_one_line_error(result, f"{kafka.bootstrap} refused this client's TLS certificate")
            assert str(certificate[0] if certificate else None) in line, "the line names the certificate file used"


def test_check_lists_what_the_cluster_lacks_or_grants_beyond_the_model(
    secured: Secured, cli_env: dict[str, str]
) -> None:
    """`deploy acls --check`: the applied ACLs match; one more grant is reported, exit 1."""
    topo, unit = secured.first, f"User:{secured.unit(secured.first)}"
    admin = _env(cli_env, secured.kafka, SUPER_USER)
    check = ["deploy", "acls", str(topo.path), "--check"]
    expected = sum(len(g.bindings()) for g in topology_grants(load_topology(topo.path)))
    clean = ok(run_cli(admin, *check))
    secured.outputs.extend([clean.stdout, clean.stderr])
    assert f"{expected} of {expected} ACL bindings present for 1 principals; 0 missing, 0 extra" in clean.stdout
    stray = f"unrelated-{secrets.token_hex(3)}"
    asyncio.run(create_acls(secured.kafka.admin(), [AclBinding(unit, "topic", stray, "literal", "Read")]))
    drift = run_cli(admin, *check)
    secured.outputs.extend([drift.stdout, drift.stderr])
    assert drift.returncode == 1, drift.stdout + drift.stderr
    assert f"extra: {unit} Read on topic '{stray}' (literal)" in drift.stdout
    assert "0 missing, 1 extra" in drift.stdout


def test_no_password_appears_in_any_output_or_log(secured: Secured, cli_env: dict[str, str], tmp_path: Path) -> None:
    """Last of the module's tests on this broker (pytest keeps a module's order): every
    command's output and every worker's log so far, the broker's own logs, and a worker
    started now at debug level, whose log shows every client setting it uses."""
    env = _env(cli_env, secured.kafka, secured.unit(secured.first))
    worker = PipelineProcess(secured.first, env, tmp_path / "debug.log", args=["--log-level", "debug"]).start()
    try:
        assert worker.terminate(timeout=60) == 0, worker.log()
    finally:
        if worker.proc is not None and worker.proc.poll() is None:
            worker.kill()
    secured.outputs.append(worker.log_path.read_text(errors="replace"))
    logs = [path.read_text(errors="replace") for path in sorted(secured.broker_logs.glob("*.log"))]
    assert len(logs) >= 2 and len(secured.outputs) >= 3, "the check must have something to search"
    text = "\n".join([*secured.outputs, *logs])
    for user in secured.kafka.security.credentials:
        assert secured.kafka.password(user) not in text, f"{user}'s password appears in an output or log"
