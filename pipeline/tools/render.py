"""How ``produce`` and ``consume`` print: one line per record for people, JSON Lines for scripts.

Text lines are plain text (no markup, no colour codes) so they read the same
in a terminal, a log file and a test's captured stdout. JSON lines carry
enough to re-decode a record exactly (``value_b64`` and the headers), plus a
summary of its tensors, so ``jq`` one-liners need no contract code.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np

from pipeline.tools.decoding import Consumed, Kind
from pipeline.tools.producer import ProduceStats
from pipeline.tools.summary import ConsumeSummary

#: Values shown per tensor unless told otherwise.
DEFAULT_VALUES = 8


# --------------------------------------------------------------------------- records


def record_line(record: Consumed, *, values: int = DEFAULT_VALUES) -> str:
    """``result  dense.results[2]@15  id=...  dense_classifier v1  logits FP32 [1, 4] [0.12, ...]  9 ms``."""
    kind = record.result_type if record.kind is Kind.RESULT and record.result_type else record.kind.value
    parts = [f"{kind:<11}", f"{record.topic}[{record.partition}]@{record.offset}"]
    parts.append(f"id={record.correlation_id or '-'}")
    key = _text(record.key)
    if key is not None and key != record.correlation_id:
        parts.append(f"key={key}")
    if record.kind is Kind.DEAD_LETTER and record.dead_letter is not None:
        dead = record.dead_letter
        stage = f" (stage {dead.stage})" if dead.stage else ""
        parts.append(f"{dead.error_class}: {dead.reason}{stage}")
    elif record.kind is Kind.UNDECODABLE:
        parts.append(record.problem or "undecodable")
    else:
        if record.model_name:
            version = f" v{record.model_version}" if record.model_version else ""
            parts.append(f"{record.model_name}{version}")
        for name, array in record.tensors.items():
            parts.append(
                f"{name} {record.datatypes.get(name, '?')} {list(np.shape(array))} {_values_text(array, values)}"
            )
    if record.latency_ms is not None:
        parts.append(f"{record.latency_ms} ms")
    return "  ".join(parts)


def record_json(record: Consumed, *, values: int = DEFAULT_VALUES) -> dict[str, Any]:
    """One JSON Lines object; ``outputs`` (results) or ``inputs`` (requests) hold tensor summaries."""
    data: dict[str, Any] = {
        "kind": record.kind.value,
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": _text(record.key),
        "correlation_id": record.correlation_id,
    }
    if record.kind in (Kind.RESULT, Kind.REQUEST):
        data["model_name"] = record.model_name
        data["model_version"] = record.model_version
        tensors = {
            name: _tensor_json(array, record.datatypes.get(name, ""), values)
            for name, array in record.tensors.items()
        }
        data["outputs" if record.kind is Kind.RESULT else "inputs"] = tensors
    if record.dead_letter is not None:
        data["error_class"] = record.dead_letter.error_class
        data["error_reason"] = record.dead_letter.reason
        data["error_stage"] = record.dead_letter.stage
    if record.problem is not None:
        data["problem"] = record.problem
    data["sent_at_ms"] = record.sent_at_ms
    data["latency_ms"] = record.latency_ms
    data["headers"] = [[name, _text(value)] for name, value in record.headers]
    data["value_b64"] = (
        None if record.value is None else base64.b64encode(record.value).decode("ascii")
    )
    return data


def json_line(data: dict[str, Any]) -> str:
    """Compact JSON on one line; NaN/Infinity become null (strict JSON for jq)."""
    return json.dumps(_finite(data), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# --------------------------------------------------------------------------- summaries


def consume_summary_lines(summary: ConsumeSummary) -> list[str]:
    s = summary.to_dict()
    by_class = ", ".join(f"{name} {n}" for name, n in s["dead_letters_by_class"].items())
    latency = s["latency_ms"]
    lines = [
        f"records          {s['records']}",
        f"results          {s['results']}",
        f"requests         {s['requests']}",
        f"dead letters     {s['dead_letters']}" + (f" ({by_class})" if by_class else ""),
        f"undecodable      {s['undecodable']}",
        f"correlation ids  {s['distinct_correlation_ids']} distinct, {s['duplicates']} duplicates",
    ]
    if latency is None:
        lines.append("latency          - (no sent-at-ms headers)")
    else:
        lines.append(
            f"latency          p50 {latency['p50']} ms, p90 {latency['p90']} ms, "
            f"p99 {latency['p99']} ms, max {latency['max']} ms ({latency['count']} records)"
        )
    lines.append(f"ordering         {s['out_of_order']} out of order within a key")
    return lines


def produce_summary(stats: ProduceStats) -> dict[str, Any]:
    return {
        "topic": stats.topic,
        "sent": stats.sent,
        "acknowledged": stats.acknowledged,
        "failed": stats.failed,
        "elapsed_s": round(stats.elapsed_s, 3),
        "rate": round(stats.rate, 1),
        "first_error": stats.first_error,
        "interrupted": stats.interrupted,
    }


def produce_summary_lines(stats: ProduceStats) -> list[str]:
    lines = [
        f"topic            {stats.topic}",
        f"sent             {stats.sent}",
        f"acknowledged     {stats.acknowledged}",
        f"failed           {stats.failed}"
        + (f" (first: {stats.first_error})" if stats.first_error else ""),
        f"elapsed          {stats.elapsed_s:.3f} s",
        f"rate             {stats.rate:.1f} records/s",
    ]
    if stats.interrupted:
        lines.append("interrupted      yes (stopped early by a signal)")
    return lines


def produce_progress_line(stats: ProduceStats) -> str:
    of = f"/{stats.planned}" if stats.planned is not None else ""
    return (
        f"sent {stats.sent}{of}, acknowledged {stats.acknowledged}, failed {stats.failed} "
        f"({stats.rate:.1f} records/s)"
    )


# --------------------------------------------------------------------------- helpers


def _text(raw: bytes | None) -> str | None:
    """Bytes as text for display; invalid UTF-8 is escaped, never dropped."""
    return None if raw is None else raw.decode("utf-8", errors="backslashreplace")


def _tensor_json(array: np.ndarray, datatype: str, values: int) -> dict[str, Any]:
    flat = np.asarray(array).ravel()
    shown = flat if values <= 0 else flat[:values]
    return {
        "datatype": datatype,
        "shape": list(np.shape(array)),
        "values": [_scalar(v) for v in shown],
        "truncated": len(shown) < len(flat),
    }


def _values_text(array: np.ndarray, values: int) -> str:
    flat = np.asarray(array).ravel()
    shown = flat if values <= 0 else flat[:values]
    items = [_scalar_text(v) for v in shown]
    if len(shown) < len(flat):
        items.append("...")
    return "[" + ", ".join(items) + "]"


def _scalar(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _scalar_text(value: Any) -> str:
    item = _scalar(value)
    if isinstance(item, float):
        return f"{item:.4g}"
    if isinstance(item, str):
        return repr(item[:40])
    return str(item)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
