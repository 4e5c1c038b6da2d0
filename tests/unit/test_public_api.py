"""The public Python API: ``from pipeline import ...`` (docs/python-api.md).

The names resolve, ``import pipeline`` alone stays cheap (the client and the topology
models are imported on first use), and a topology written in Python is the same object
as its YAML twin.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import pipeline

REPO = Path(__file__).resolve().parents[2]
PUBLIC = {
    "Client",
    "SyncClient",
    "InferResult",
    "load_topology",
    "Topology",
    "PipelineError",
    "ConfigError",
    "EndpointUnreachable",
    "ClientError",
    "ClientClosed",
    "InferenceFailed",
    "RequestDeadLettered",
    "RequestTimedOut",
    "__version__",
}


def test_the_documented_names_import() -> None:
    from pipeline import Client, SyncClient, load_topology

    assert callable(Client) and callable(SyncClient) and callable(load_topology)
    assert set(pipeline.__all__) == PUBLIC
    for name in pipeline.__all__:
        assert getattr(pipeline, name) is not None, name
    assert PUBLIC <= set(dir(pipeline))


def test_the_public_names_are_the_implementations() -> None:
    from pipeline.client import Client, InferResult, RequestDeadLettered, RequestTimedOut, SyncClient
    from pipeline.errors import PipelineError
    from pipeline.topology import Topology, load_topology

    assert pipeline.Client is Client and pipeline.SyncClient is SyncClient and pipeline.InferResult is InferResult
    assert pipeline.Topology is Topology and pipeline.load_topology is load_topology
    assert pipeline.RequestDeadLettered is RequestDeadLettered and pipeline.RequestTimedOut is RequestTimedOut
    # Every error the client raises is a PipelineError: one `except` catches them all.
    errors = ("ClientError", "ClientClosed", "InferenceFailed", "RequestDeadLettered", "RequestTimedOut", "ConfigError")
    assert all(issubclass(getattr(pipeline, name), PipelineError) for name in errors)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        pipeline.Nope  # noqa: B018


def test_the_version_is_the_project_version() -> None:
    assert pipeline.__version__ == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_import_pipeline_loads_neither_the_client_nor_kafka() -> None:
    code = (
        "import sys, pipeline\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiokafka', 'tritonclient', 'pydantic')\n"
        "             or m.startswith(('pipeline.client', 'pipeline.topology'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_a_topology_written_in_python_equals_its_yaml_twin() -> None:
    """topologies/dense.yaml, written by hand as a user would (nested sections as dicts)."""
    from pipeline import Topology, load_topology

    dense = Topology(
        name="dense-demo",
        kafka={"partitions": 4, "replication_factor": 1},  # bootstrap servers: from the environment
        input_topic="dense.requests",
        result_topic="dense.results",
        dead_letter_topic="dense.dead-letters",
        metrics_topic="pipeline.metrics",
        metrics_interval_s=10,
        stages=[
            {
                "name": "classify",
                "kind": "stateless",
                "model": "dense_classifier",
                "model_version": "",
                "batching": {
                    "max_batch_size": None,
                    "max_queue_delay_ms": 5.0,
                    "max_inflight_batches": 4,
                    "max_pending_requests": 4096,
                },
                "retry": {"max_attempts": 5, "initial_backoff_ms": 100, "max_backoff_ms": 5000},
                "warmup": False,
            }
        ],
    )
    # No KAFKA_BOOTSTRAP / TRITON_URL: the YAML's ${...:-} are empty, i.e. "from the environment".
    from_yaml = load_topology(REPO / "topologies" / "dense.yaml", environ={})
    assert dense == from_yaml
    assert dense.model_dump() == from_yaml.model_dump()
    assert dense.topics() == from_yaml.topics()
    # The comparison is not vacuous: one changed field and they differ.
    assert dense.model_copy(update={"metrics_interval_s": 11.0}) != from_yaml
