"""Start a Kafka client as a command-line tool should: one line when the broker does not answer."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from pipeline.contract.errors import one_line
from pipeline.errors import EndpointUnreachable
from pipeline.kafka.clients import check_connection
from pipeline.settings import KafkaSettings


async def start_client(client: AIOKafkaProducer | AIOKafkaConsumer, settings: KafkaSettings, timeout: float) -> None:
    """Start ``client``; no answer within ``timeout`` is :class:`EndpointUnreachable`, one line."""
    try:
        await check_connection(settings)  # a TLS or login failure named in one line, before aiokafka hides it
        await asyncio.wait_for(client.start(), timeout)
    except EndpointUnreachable:
        await client.stop()
        raise
    except (KafkaError, OSError, asyncio.TimeoutError) as exc:
        await client.stop()
        reason = one_line(str(exc)) or f"no answer within {timeout:g} s"
        raise EndpointUnreachable(f"cannot reach Kafka at {settings.bootstrap_servers}: {reason}") from None
