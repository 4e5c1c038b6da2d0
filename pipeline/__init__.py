"""Event-driven streaming inference pipelines: Kafka in, Triton Inference Server in the middle, Kafka out.

The public Python API is the names in :data:`__all__` (docs/python-api.md)::

    from pipeline import SyncClient, load_topology

    with SyncClient(load_topology("topologies/dense.yaml")) as client:
        result = client.infer({"features": x})

Everything else under ``pipeline`` and ``workers`` is internal and may change
between versions. The client and topology names are imported on first use
(module ``__getattr__``): ``import pipeline`` stays cheap and loads neither
Kafka's nor Triton's client libraries.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from pipeline.errors import ConfigError, EndpointUnreachable, PipelineError

if TYPE_CHECKING:
    from pipeline.client.client import Client
    from pipeline.client.errors import (
        ClientClosed,
        ClientError,
        InferenceFailed,
        RequestDeadLettered,
        RequestTimedOut,
    )
    from pipeline.client.result import InferResult
    from pipeline.client.sync import SyncClient
    from pipeline.topology.loader import load_topology
    from pipeline.topology.model import Topology

__version__ = "0.1.0"

_LAZY = {
    "Client": "pipeline.client.client",
    "SyncClient": "pipeline.client.sync",
    "InferResult": "pipeline.client.result",
    "ClientError": "pipeline.client.errors",
    "ClientClosed": "pipeline.client.errors",
    "InferenceFailed": "pipeline.client.errors",
    "RequestDeadLettered": "pipeline.client.errors",
    "RequestTimedOut": "pipeline.client.errors",
    "load_topology": "pipeline.topology.loader",
    "Topology": "pipeline.topology.model",
}
"""Public name -> the module defining it, imported when the name is first asked for."""

__all__ = [
    "Client",
    "ClientClosed",
    "ClientError",
    "ConfigError",
    "EndpointUnreachable",
    "InferResult",
    "InferenceFailed",
    "PipelineError",
    "RequestDeadLettered",
    "RequestTimedOut",
    "SyncClient",
    "Topology",
    "__version__",
    "load_topology",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
