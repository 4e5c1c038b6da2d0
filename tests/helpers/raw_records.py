"""Record batches no well-behaved client writes: header keys that are not UTF-8, bad CRCs.

Built with aiokafka's own pure-Python batch builder (a header key is written as
``key.encode("utf-8")``, so a ``str`` whose ``encode`` returns raw bytes writes
any bytes) and produced with a plain ``ProduceRequest`` through aiokafka's
low-level client: the broker stores what it is sent. librdkafka's Python
binding cannot do it: ``confluent_kafka`` turns a ``bytes`` header key into its
``repr`` text (checked with 2.16.1: ``b"\\xff\\xfe"`` arrives as ``"b'\\\\xff\\\\xfe'"``).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.structs import TopicPartition
from typing_extensions import Self

_CRC_AT = 17  # BaseOffset(8) Length(4) PartitionLeaderEpoch(4) Magic(1)


class RawKey(str):
    """A header key the builder writes as the given bytes, UTF-8 or not."""

    raw: bytes

    def __new__(cls, raw: bytes) -> Self:
        self = super().__new__(cls, raw.decode("utf-8", "backslashreplace"))
        self.raw = raw
        return self

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


@dataclass
class RawRecord:
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = field(default_factory=list)


def build_batch(records: Sequence[RawRecord], *, compression: int = 0, corrupt_crc: bool = False) -> bytes:
    """One v2 record batch (offsets from 0, as a producer sends them); optionally with a wrong CRC."""
    builder = _DefaultRecordBatchBuilderPy(2, compression, 0, -1, -1, -1, 64 << 20)
    now = int(time.time() * 1000)
    for i, record in enumerate(records):
        assert builder.append(i, now, record.key, record.value, list(record.headers)) is not None
    data = bytearray(builder.build())
    if corrupt_crc:
        (crc,) = struct.unpack_from(">I", data, _CRC_AT)
        struct.pack_into(">I", data, _CRC_AT, crc ^ 0xFFFFFFFF)
    return bytes(data)


async def produce_raw_batch(bootstrap: str, tp: TopicPartition, batch: bytes) -> int:
    """Produce ``batch`` to ``tp`` as is (acks=all); returns the base offset the broker gave it."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        cluster = await client.fetch_all_metadata()
        leader = cluster.leader_for_partition(tp)
        assert leader is not None and leader >= 0, f"no leader for {tp}"
        request = ProduceRequest(
            transactional_id=None, required_acks=-1, timeout=10_000, topics=[(tp.topic, [(tp.partition, batch)])]
        )
        response = await client.send(leader, request)
        (_, partitions), = response.topics
        (_, error_code, base_offset, *_), = partitions
        assert error_code == 0, f"produce of a raw batch to {tp} failed with error code {error_code}"
        return int(base_offset)
    finally:
        await client.close()
