"""Call a topology from Python: request-reply over Kafka with numpy in and out.

``async with Client("topologies/dense.yaml") as c: r = await c.infer({"features": x})``;
``SyncClient`` for scripts and notebooks.
See the README, "Calling a topology from Python", and ``docs/message-contract.md``
for the ``reply-topic`` header.
"""

from pipeline.client.client import Client, ClientOptions
from pipeline.client.errors import ClientClosed, ClientError, InferenceFailed, RequestDeadLettered, RequestTimedOut
from pipeline.client.result import InferResult
from pipeline.client.stream import StreamSession
from pipeline.client.sync import SyncClient
from pipeline.client.waiters import ClientStats

__all__ = [
    "Client",
    "ClientClosed",
    "ClientError",
    "ClientOptions",
    "ClientStats",
    "InferResult",
    "InferenceFailed",
    "RequestDeadLettered",
    "RequestTimedOut",
    "StreamSession",
    "SyncClient",
]
