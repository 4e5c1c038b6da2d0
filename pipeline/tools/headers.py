"""Client-side headers: what ``pipeline produce`` adds so ``pipeline consume`` can measure.

Stages carry every request header through to the result record (see
:func:`pipeline.contract.records.result_headers`), so a timestamp stamped by
the producer comes back on the result. Comparing it with the result record's
own timestamp gives end-to-end latency without any shared state between the
two commands, which may run on different machines (clock skew included).
"""

from __future__ import annotations

import time

#: Wall-clock milliseconds since the epoch at which the producer handed the record to Kafka.
SENT_AT_MS = "sent-at-ms"


def now_ms() -> int:
    """Milliseconds since the epoch, the unit of Kafka record timestamps."""
    return time.time_ns() // 1_000_000
