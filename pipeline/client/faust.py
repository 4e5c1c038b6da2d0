"""Call a topology from a Faust app: a :class:`TopologyCaller` started and stopped with it.

Faust (faust-streaming) apps already consume and produce Kafka topics; this lets their
agents call a topology the way they call anything else asynchronous::

    caller = TopologyCaller(app, "topologies/dense.yaml")

    @app.agent(events)
    async def classify(stream):
        async for event in stream.events():
            result = await caller.infer({"features": decode(event.value)})
            await sink.send(key=event.key, value=result.outputs["logits"].tolist())

The caller is a Faust service: it is added to the app as a dependency when created, so
the worker starts its :class:`~pipeline.client.Client` before the agents (an agent's
first call never finds it closed) and closes it after them (a call in flight when the
worker stops is cancelled with its agent, not failed with ``ClientClosed``).

Two ways to call, chosen by what a Faust user needs from delivery:

* :meth:`TopologyCaller.infer` in an agent's loop: the event is acknowledged when the
  agent moves on, after the result was handled, so a crash redelivers it (at least
  once). One call at a time per agent instance; ``@app.agent(..., concurrency=N)`` runs
  N instances (results then leave out of order, as with any concurrent Faust agent).
* :meth:`TopologyCaller.results` turns the agent's stream into a stream of
  :class:`CallOutcome` in event order: it takes events as Faust's ``take_events`` does
  (up to ``max_in_flight`` or ``within`` seconds), has the whole batch in flight at
  once through ``Client.infer_many``, and yields each outcome as it is ready. Faust
  acknowledges the batch's events only when the agent asks for the next batch, so
  pipelining keeps the at-least-once guarantee.

Results are not sent to a Faust channel: a channel would acknowledge the source event
when it is handed over, and a crash would lose every call in flight.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pipeline.client.client import Client, ClientOptions
from pipeline.client.errors import ClientClosed, ClientError
from pipeline.client.result import InferResult
from pipeline.client.waiters import ClientStats
from pipeline.errors import ConfigError
from pipeline.settings import KafkaSettings
from pipeline.topology.loader import load_topology
from pipeline.topology.model import Topology

try:
    import faust
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "pipeline.client.faust needs faust-streaming: pip install 'streaming-inference-pipeline[faust]'"
    ) from exc

log = logging.getLogger(__name__)

Inputs = Mapping[str, Any] | np.ndarray

#: How long :meth:`TopologyCaller.results` waits to fill a batch: the most a lone event waits.
DEFAULT_WITHIN_S = 0.02


@dataclass(frozen=True, eq=False)
class CallOutcome:
    """One event of the agent's stream and what its call gave: a result, or the typed error
    (dead letter, timeout) that ``Client.infer`` would have raised."""

    event: faust.EventT[Any]
    result: InferResult | None = None
    error: ClientError | None = None

    def unwrap(self) -> InferResult:
        """The result, or its error raised."""
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class TopologyCaller(faust.Service):
    """A :class:`~pipeline.client.Client` that lives as long as its Faust app.

    Create it where topics and agents are declared (before the worker starts): it joins
    the app's services then. ``kafka``: where the topology's topics are; by default the
    app's own broker (``app.conf.broker``), with the ``PIPELINE_KAFKA_*`` variables for
    TLS/SASL, since the app's ``broker_credentials`` cannot be copied faithfully.
    ``options``: the keywords of :class:`~pipeline.client.ClientOptions` (``timeout``,
    ``reply``, ...), checked here so a wrong one fails at import, not at start.
    """

    def __init__(
        self,
        app: faust.App,
        topology: Topology | str | os.PathLike[str],
        *,
        kafka: KafkaSettings | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.app = app
        self.topology = topology if isinstance(topology, Topology) else load_topology(topology)
        self.options = ClientOptions(**options)
        self._kafka = kafka
        self._options = options
        self._client: Client | None = None
        app.add_dependency(self)

    @property
    def client(self) -> Client:
        """The running client (``reply_topic``, ``stats``, ``infer_many``, ``stream``...)."""
        if self._client is None:
            raise ClientClosed("the caller is not started: it starts with its Faust app")
        return self._client

    @property
    def stats(self) -> ClientStats:
        return self.client.stats

    async def on_start(self) -> None:
        """Connect before the app's agents start (they are started after this service)."""
        client = Client(self.topology, kafka=self._kafka or app_kafka_settings(self.app), **self._options)
        await client.start()
        self._client = client
        log.info("calling topology %s, replies on %s", self.topology.name, client.reply_topic or "the result topic")

    async def on_stop(self) -> None:
        """Close after the agents stopped; deletes the client's own reply topic."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def infer(self, inputs: Inputs, **call: Any) -> InferResult:
        """One call, awaited: :meth:`pipeline.client.Client.infer` (same keywords, same errors)."""
        return await self.client.infer(inputs, **call)

    async def results(
        self,
        stream: faust.StreamT[Any],
        inputs: Callable[[faust.EventT[Any]], Inputs],
        *,
        max_in_flight: int = 64,
        within: float = DEFAULT_WITHIN_S,
        timeout: float | Literal["default"] | None = "default",
    ) -> AsyncIterator[CallOutcome]:
        """The agent's ``stream`` as a stream of outcomes, in event order, acknowledged at
        least once (see the module's docstring). ``inputs(event)`` makes an event's request
        (``{tensor name: array}``, or one array for a single-input topology).

        A dead letter or a timeout is an outcome (``error`` set): the agent decides what an
        unanswerable event becomes. A closed client raises ``ClientClosed`` instead, so an
        event is never acknowledged for a call that was not made.
        """
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if not isinstance(stream, faust.Stream):  # take_events is Stream's, not StreamT's
            raise TypeError(f"results() takes the agent's faust.Stream, not {type(stream).__name__}")
        async for events in stream.take_events(max_in_flight, within):
            calls = self.client.infer_many(
                [inputs(event) for event in events], max_in_flight=len(events), timeout=timeout, return_exceptions=True
            )
            position = 0
            async for got in calls:
                event = events[position]
                position += 1
                if isinstance(got, ClientClosed):
                    raise got
                if isinstance(got, ClientError):
                    yield CallOutcome(event, error=got)
                else:
                    yield CallOutcome(event, result=got)


def app_kafka_settings(app: faust.App) -> KafkaSettings:
    """The app's brokers as :class:`KafkaSettings` (security from ``PIPELINE_KAFKA_*``).

    Refuses an app whose broker takes credentials while those variables say plaintext:
    connecting without them would fail late and obscurely, or talk to another listener.
    """
    servers = ",".join(f"{url.host}:{url.port or 9092}" for url in app.conf.broker)
    settings = KafkaSettings(bootstrap_servers=servers)
    if app.conf.broker_credentials is not None and settings.security_protocol == "PLAINTEXT":
        raise ConfigError(
            "the Faust app's broker takes credentials, which TopologyCaller does not copy: pass "
            "kafka=KafkaSettings(...) or set PIPELINE_KAFKA_SECURITY_PROTOCOL and its options"
        )
    return settings
