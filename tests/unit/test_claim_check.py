"""Claim checks as pure logic: names, headers, the manifest, limits and the oversize rule.

The S3 round trip itself runs against the real store in
``tests/integration/test_record_sizes.py``; here the store is absent or a
failing stand-in, which is exactly what the rule must survive.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json

from aiokafka.structs import TopicPartition

from pipeline.contract.headers import Headers
from pipeline.contract.records import (
    ClaimCheck,
    claim_check_headers,
    dead_letter_headers,
    read_claim_check,
    read_dead_letter,
    replay_headers,
)
from pipeline.deadletter.claim_check import ClaimCheckStore, ClaimName, manifest
from pipeline.deadletter.oversize import OversizeOutputs, record_size
from pipeline.kafka.clients import RECORD_HEADROOM_BYTES, RecordLimits
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs, OutRecord
from pipeline.settings import S3Settings

ORIGINAL: Headers = [("content-type", b"application/json"), ("x-app", b"\xff\x00raw")]


def test_names_are_deterministic_per_record_and_output() -> None:
    name = ClaimName("dense.requests", 3, 1234)
    assert name.value_key == "dense.requests/3/1234/value"
    assert name.record_key == "dense.requests/3/1234/record.json"
    assert ClaimName("dense.requests", 3, 1234, index=2).base == "dense.requests/3/1234.2"
    assert ClaimName("dense.requests", 3, 1234) == name  # a replay writes the same objects


def test_store_uri_names_its_own_bucket() -> None:
    store = ClaimCheckStore(S3Settings(endpoint="http://127.0.0.1:1", dead_letter_bucket="dl"))
    assert store.uri(ClaimName("t", 0, 7)) == "s3://dl/t/0/7/value"


def test_headers_keep_the_dead_letter_and_add_the_claim_check() -> None:
    dead = dead_letter_headers(ORIGINAL, stage="classify", error_class="malformed-request", reason="bad", now_ms=5)
    check = ClaimCheck(size=10, sha256="ab" * 32, uri="s3://dl/t/0/7/value")
    headers = claim_check_headers(dead, check)
    assert headers[: len(dead)] == dead
    assert read_dead_letter(headers).error_class == "malformed-request"
    assert read_claim_check(headers) == check
    assert dict(headers)["claim-check-status"] == b"stored"
    assert replay_headers(headers) == ORIGINAL


def test_not_kept_says_so_and_why() -> None:
    headers = claim_check_headers([], ClaimCheck(size=3, sha256="00", error="S3 put failed:\nboom"))
    check = read_claim_check(headers)
    assert check is not None and not check.stored and check.uri is None
    assert dict(headers)["claim-check-status"] == b"not-kept"
    assert check.error == "S3 put failed: boom"
    assert read_claim_check(ORIGINAL) is None


def test_manifest_keeps_key_and_headers_byte_for_byte() -> None:
    value = b"v" * 100
    doc = json.loads(manifest(ClaimName("t", 1, 2), b"k\xff", value, [*ORIGINAL, ("null", None)]))
    assert base64.b64decode(doc["key"]) == b"k\xff"
    assert [(k, None if v is None else base64.b64decode(v)) for k, v in doc["headers"]] == [
        *ORIGINAL,
        ("null", None),
    ]
    assert doc["size"] == 100 and doc["sha256"] == hashlib.sha256(value).hexdigest()


def test_limits_follow_the_largest_request_with_headroom() -> None:
    limits = RecordLimits.for_values(16 << 20, dead_letter_max_bytes=1 << 20)
    assert limits.max_record_bytes == (16 << 20) + RECORD_HEADROOM_BYTES
    assert limits.producer_kwargs() == {"max_request_size": limits.max_record_bytes}
    assert limits.consumer_kwargs()["max_partition_fetch_bytes"] == limits.max_record_bytes
    assert limits.consumer_kwargs()["fetch_max_bytes"] >= limits.max_record_bytes
    assert limits.topic_configs() == {"max.message.bytes": str(limits.max_record_bytes)}
    small = RecordLimits.for_values(1000, dead_letter_max_bytes=1 << 30)
    assert small.dead_letter_max_bytes == small.max_record_bytes  # never above the record limit


class _FailingStore(ClaimCheckStore):
    def __init__(self) -> None:  # no client: every put fails like an unreachable store
        pass

    def put(self, *args: object, **kwargs: object) -> ClaimCheck:
        raise ConnectionError("S3 unreachable")


def _oversize(store: ClaimCheckStore | None, seen: list[str]) -> OversizeOutputs:
    return OversizeOutputs(
        stage="classify",
        dead_letter_topic="dl",
        limits=RecordLimits(max_record_bytes=4000, dead_letter_max_bytes=2000),
        store=store,
        on_claim_check=seen.append,
    )


def _slot() -> Slot[Outputs]:
    return Slot(TopicPartition("in", 2), 41)


def test_oversize_rule_picks_dead_letters_and_results_over_their_limits() -> None:
    rule = _oversize(None, [])
    dead = OutRecord("dl", b"k", b"x" * 3000, [], dead_letter=True)
    result = OutRecord("out", b"k", b"x" * 3000, [])
    checkpoint = OutRecord("state", b"k", b"x" * 9000, [], counts_as_result=False)
    assert rule.too_large(dead) and not rule.too_large(result)
    assert rule.too_large(OutRecord("out", b"k", b"x" * 5000, []))
    assert not rule.too_large(checkpoint)  # checkpoints are never rewritten
    assert record_size(b"k", b"x" * 3000, []) > 3000


def test_without_a_store_the_dead_letter_leaves_empty_marked_and_counted() -> None:
    seen: list[str] = []
    value = b"x" * 3000
    headers = dead_letter_headers(ORIGINAL, stage="classify", error_class="malformed-request", reason="r", now_ms=1)
    dead = OutRecord("dl", b"k", value, headers, dead_letter=True, error_class="malformed-request")
    out = asyncio.run(_oversize(None, seen).replace(dead, _slot(), 0))
    assert out.value == b"" and out.key == b"k" and out.dead_letter
    check = read_claim_check(out.headers)
    assert check is not None and not check.stored and check.size == 3000
    assert check.sha256 == hashlib.sha256(value).hexdigest()
    assert replay_headers(out.headers) == ORIGINAL
    assert seen == ["not-kept"]


def test_a_failing_store_never_raises_and_a_result_becomes_result_too_large() -> None:
    seen: list[str] = []
    result = OutRecord("out", b"k", b"r" * 5000, [("correlation-id", b"c1")], request_timestamp_ms=9)
    out = asyncio.run(_oversize(_FailingStore(), seen).replace(result, _slot(), 1))
    assert out.topic == "dl" and out.dead_letter and out.error_class == "result-too-large"
    assert read_dead_letter(out.headers).error_class == "result-too-large"
    check = read_claim_check(out.headers)
    assert check is not None and not check.stored and "S3 unreachable" in (check.error or "")
    assert out.value == b"" and out.request_timestamp_ms == 9
    assert seen == ["not-kept"]


def test_headers_too_large_for_the_dead_letter_topic_are_left_to_the_manifest() -> None:
    headers = dead_letter_headers(
        [("blob", b"b" * 5000)], stage="classify", error_class="oversized-value", reason="r", now_ms=1
    )
    dead = OutRecord("dl", b"k", b"x", headers, dead_letter=True)
    out = asyncio.run(_oversize(None, []).replace(dead, _slot(), 0))
    assert [k for k, _ in out.headers if k == "blob"] == []
    assert read_dead_letter(out.headers).error_class == "oversized-value"
    assert record_size(out.key, out.value, out.headers) <= 2000
