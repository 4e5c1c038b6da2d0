"""The Apache Kafka node configuration the embedded stack writes, checked without starting a JVM."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pytest

from pipeline.embedded.kafka_broker import (
    KAFKA_LIB_ENV,
    KAFKA_VERSION,
    KafkaNode,
    kafka_lib_dir,
    new_cluster_id,
    rss_bytes,
    server_properties,
)
from pipeline.embedded.stack import EmbeddedStack
from pipeline.errors import ConfigError, PipelineError

REPO = Path(__file__).resolve().parents[2]


def _parse(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")]
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), "a key is written twice"
    return dict((k, v) for k, v in pairs)


def _cluster(tmp_path: Path, size: int) -> list[KafkaNode]:
    return [KafkaNode(i, 9000 + i, 9100 + i, tmp_path / f"node-{i}") for i in range(1, size + 1)]


def test_single_node_is_its_own_quorum_with_replication_factor_1(tmp_path: Path) -> None:
    [node] = _cluster(tmp_path, 1)
    props = _parse(server_properties(node, [node]))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9101"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9001,CONTROLLER://127.0.0.1:9101"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9001"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(tmp_path / "node-1")
    assert props["group.initial.rebalance.delay.ms"] == "0"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor", "transaction.state.log.min.isr"):
        assert props[key] == "1", key


def test_three_nodes_share_a_three_voter_quorum_and_replicate_internal_topics(tmp_path: Path) -> None:
    nodes = _cluster(tmp_path, 3)
    configs = [_parse(server_properties(node, nodes)) for node in nodes]
    assert {c["controller.quorum.voters"] for c in configs} == {"1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"}
    assert [c["node.id"] for c in configs] == ["1", "2", "3"]
    assert len({c["log.dirs"] for c in configs}) == 3
    assert len({c["listeners"] for c in configs}) == 3
    for config in configs:
        assert config["offsets.topic.replication.factor"] == "3"
        assert config["transaction.state.log.replication.factor"] == "3"
        assert config["transaction.state.log.min.isr"] == "2"


def test_a_node_must_belong_to_the_cluster(tmp_path: Path) -> None:
    nodes = _cluster(tmp_path, 3)
    with pytest.raises(ValueError, match="not in the cluster"):
        server_properties(nodes[0], nodes[1:])


def test_cluster_ids_are_16_random_bytes_that_never_read_as_an_option() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for value in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", value) and not value.startswith("-")
        assert len(base64.urlsafe_b64decode(value + "==")) == 16


def test_pom_and_module_name_the_same_kafka_version() -> None:
    pom = (REPO / "scripts" / "kafka" / "pom.xml").read_text()
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert match is not None and match.group(1) == KAFKA_VERSION


def test_the_jar_cache_is_git_ignored() -> None:
    assert "/.cache/" in (REPO / ".gitignore").read_text().splitlines()


def test_missing_jars_name_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KAFKA_LIB_ENV, str(tmp_path / "empty"))
    with pytest.raises(PipelineError, match=re.escape("scripts/install.sh --test")):
        kafka_lib_dir()


def test_more_than_one_broker_needs_apache_kafka() -> None:
    with pytest.raises(ConfigError, match=re.escape("broker='kafka'")):
        EmbeddedStack(services=("kafka",), brokers=3)
    with pytest.raises(ConfigError, match="local disk"):
        EmbeddedStack(services=("kafka",), broker="kafka", broker_storage="s3")


def test_rss_is_read_from_proc() -> None:
    assert 1 << 20 < rss_bytes(os.getpid()) < 64 << 30


def test_the_default_broker_is_apache_kafka_where_installed_else_tansu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pipeline up` and `pipeline run`'s embedded stack: Apache Kafka where Java and its jars
    are, Tansu where they are not, and $PIPELINE_EMBEDDED_BROKER over both."""
    from pipeline.embedded import kafka_broker
    from pipeline.embedded.stack import BROKER_ENV, default_broker

    monkeypatch.delenv(BROKER_ENV, raising=False)
    jars = tmp_path / "lib"
    jars.mkdir()
    (jars / "kafka_2.13-9.9.jar").write_bytes(b"")
    monkeypatch.setenv(KAFKA_LIB_ENV, str(jars))
    monkeypatch.setattr(kafka_broker.shutil, "which", lambda name: "/usr/bin/java")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert default_broker() == "kafka"
    monkeypatch.setattr(kafka_broker.shutil, "which", lambda name: None)  # no Java
    assert default_broker() == "tansu"
    monkeypatch.setattr(kafka_broker.shutil, "which", lambda name: "/usr/bin/java")
    monkeypatch.setenv(KAFKA_LIB_ENV, str(tmp_path / "empty"))  # no jars
    assert default_broker() == "tansu"
    monkeypatch.setenv(BROKER_ENV, "kafka")
    assert default_broker() == "kafka"
    monkeypatch.setenv(BROKER_ENV, "Tansu")
    assert default_broker() == "tansu"
    monkeypatch.setenv(BROKER_ENV, "redpanda")
    with pytest.raises(ConfigError, match="PIPELINE_EMBEDDED_BROKER='redpanda'"):
        default_broker()
