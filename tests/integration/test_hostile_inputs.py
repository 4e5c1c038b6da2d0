"""The hostile-input campaign (issue 9, item 9): whatever a topology is sent, every record gets
exactly one outcome and the worker stays up.

Three real `pipeline run` processes, one per topology, started once for the module against the
session's real broker (Tansu), S3 store (moto) and Triton:

- ``dense``: one stateless dense_classifier stage (topologies/dense.yaml), ``max_request_bytes``
  4 MiB (so "the limit + 1" is above Kafka's 1 MiB default and a valid 3 MiB request fits);
- ``audio``: DALI preprocessing (CPU) then the Silero VAD sequence stage (topologies/audio.yaml),
  ``gap_timeout_s`` 1 s;
- ``ensemble``: normalise -> classify + score -> inner join of the result (topologies/ensemble.yaml),
  window 2 s.

Part 1 sends the hand-made hostile kinds of :func:`kinds` (the table is mirrored in
docs/message-contract.md, "Hostile input campaign"); part 2 sends 10,000 seeded mutations of
valid protobuf, JSON and WAV-chunk records (bit flips, truncation, duplicated spans, splices,
header and key changes, sizes up to the limit + 1, timestamps a year away) to the dense and
audio topologies. Every record carries an ``x-test-seq`` header, which the contract keeps byte
for byte on results and dead letters (a claim check whose headers did not fit keeps it in its
S3 manifest), so every output is matched back to the record it answers.

Checked: each record has exactly one outcome (its result, or dead letter(s) with the expected
error class from the expected stage, or a documented drop); the records without an output are
exactly as many as the delta of ``pipeline_records_dropped_total`` (per stage and reason); no
output answers a record that was not sent; the workers never exit (polled throughout, exit code
0 at SIGTERM); the RSS of each worker grows by at most ``RSS_BOUND``.

The last test runs a fourth, short-lived worker: records whose header key is not UTF-8 among
2 MiB requests (alone behind 6 MiB of them, and inside a 6 MiB record batch), all produced
before it starts, so its first fetch holds them all.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import itertools
import json
import re
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, TopicPartition
from tritonclient.grpc import service_pb2 as pb

from pipeline.audio.wav import WAVE_FORMAT_IEEE_FLOAT, WAVE_FORMAT_PCM, canonical_wav, wav_header
from pipeline.contract.errors import BadRequest
from pipeline.contract.records import read_claim_check, read_dead_letter
from pipeline.contract.request import decode_request, encode_request
from pipeline.contract.response import decode_response
from pipeline.deadletter.claim_check import ClaimCheckStore
from pipeline.kafka.clients import RecordLimits, ensure_topics
from pipeline.settings import KafkaSettings, S3Settings
from tests.helpers import topology_process as tp
from tests.helpers.dense_reference import mlp_reference, norm_reference, random_features, score_reference
from tests.helpers.kafka_io import header
from tests.helpers.raw_records import RawKey, RawRecord, build_batch, produce_raw_batch
from tests.helpers.record_fill import filled
from tests.helpers.streams import AUDIO_STAGES, SEQUENCE_STAGE

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

Rec = ConsumerRecord[bytes, bytes]
Headers = list[tuple[str, bytes | None]]

MiB = 1 << 20
DENSE_LIMIT = 4 * MiB
"""The dense stage's ``max_request_bytes``: the limit + 1 is above Kafka's 1 MiB default."""
AUDIO_LIMIT = 2 * MiB
"""The DALI stage's ``max_request_bytes``."""
RSS_BOUND = 300 * MiB
"""How much each worker's resident memory may grow over the whole campaign."""
SEQ = "x-test-seq"
"""The test's own header: which produced record an output answers."""
FUZZ_SEED = 20_260_909
FUZZ_DENSE = 6_000
FUZZ_AUDIO = 4_000
GRACE_S = 2.0
"""After every expected outcome arrived, keep reading this long: a second outcome would show."""
SR = 16_000
FRAME = 512
YEAR_MS = 365 * 24 * 3600 * 1000

# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Expect:
    """What one logical record must end as."""

    results: int = 0
    """Primary results (a sequence stage's ``chunk`` results; gap/segment/summary are extra)."""
    dead: tuple[str, ...] = ()
    """Acceptable error classes of its dead letter(s) (several where the contract is in flux)."""
    dead_count: tuple[int, int] = (0, 0)
    """Fewest and most dead letters (a fan-out record may have one per branch record)."""
    stage: str | None = None
    """The stage that dead-letters it."""
    drops: int = 0
    """Physical records of it that end as a documented, counted drop."""
    drop_reason: str = ""
    any_one: bool = False
    """Exactly one outcome, whichever (where the contract does not say which)."""
    fuzz_drop_ok: bool = False
    """Fuzz: no output is allowed when the topology counted a drop for it."""

    def describe(self) -> str:
        if self.any_one:
            return "one outcome (result or any dead letter)"
        parts = []
        if self.results:
            parts.append("result" if self.results == 1 else f"{self.results} results")
        if self.dead:
            low, high = self.dead_count
            count = "" if (low, high) == (1, 1) else f"{low}-{high}× "
            parts.append(f"{count}dead letter {' or '.join(self.dead)}" + (f" @{self.stage}" if self.stage else ""))
        if self.drops:
            count = "" if self.drops == 1 else f"{self.drops}× "
            parts.append(f"{count}drop {self.drop_reason}" + (f" @{self.stage}" if self.stage else ""))
        return " + ".join(parts) or "nothing"


RESULT = Expect(results=1)
ONE_OUTCOME = Expect(any_one=True)


def dead(*classes: str, stage: str | None = None, count: tuple[int, int] = (1, 1)) -> Expect:
    return Expect(dead=classes, dead_count=count, stage=stage)


def drop(reason: str, stage: str) -> Expect:
    return Expect(drops=1, drop_reason=reason, stage=stage)


@dataclass
class Send:
    """One physical record to produce."""

    value: bytes | None
    headers: Headers
    key: bytes | None
    topic: str = ""
    """"" = the topology's input topic; else the suffix after "<topology name>." (a branch topic)."""
    timestamp_ms: int | None = None
    raw_header_key: bytes | None = None
    """A header key that is not UTF-8: the record is produced in a hand-built batch."""


@dataclass
class Item:
    """One logical record (one ``x-test-seq``): usually one physical record; a join's branch
    records of one correlation ID share it."""

    sends: list[Send]
    expect: Expect
    probe: bool = True
    """The hostile record of its kind (the others are the context it needs, e.g. a stream)."""
    seq: int = -1


@dataclass
class Kind:
    topology: str
    name: str
    items: list[Item]

    @property
    def probes(self) -> list[Item]:
        return [i for i in self.items if i.probe]


_SEQS = itertools.count(1)
_SENT: dict[int, list[Send]] = {}
"""Every logical record produced, by seq (for diagnostics)."""


def _probe(send: Send | list[Send], expect: Expect) -> Item:
    return Item(send if isinstance(send, list) else [send], expect)


def _context(send: Send, expect: Expect = RESULT) -> Item:
    return Item([send], expect, probe=False)


def _send(record: Any, **changes: Any) -> Send:
    """A :class:`Send` from an ``encode_request`` Record, with changes."""
    base = Send(record.value, list(record.headers), record.key)
    return replace(base, **changes)


def _with_headers(headers: Headers, *extra: tuple[str, bytes | None], drop: Sequence[str] = ()) -> Headers:
    return [(k, v) for k, v in headers if k not in drop] + list(extra)


# --------------------------------------------------------------------------- dense kinds

FEATURES = random_features(128, seed=909)
JSON_CT = [("content-type", b"application/json")]
PB_CT = [("content-type", b"application/vnd.oip.v2.infer-request+protobuf")]


def _pb(cid: str, rows: int = 1, **kw: Any) -> Send:
    return _send(encode_request({"features": FEATURES[:rows]}, correlation_id=cid, **kw))


def _js(cid: str, rows: int = 1, **kw: Any) -> Send:
    return _send(encode_request({"features": FEATURES[:rows]}, correlation_id=cid, form="json", **kw))


def _json_body(cid: str | None, inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    body: dict[str, Any] = {} if cid is None else {"id": cid}
    body["inputs"] = inputs
    body.update(extra)
    return json.dumps(body).encode()


def _json_tensor(
    name: str = "features", shape: Any = (1, 16), datatype: str = "FP32", data: Any = None
) -> dict[str, Any]:
    values = FEATURES[0].tolist() if data is None else data
    return {
        "name": name,
        "shape": list(shape) if isinstance(shape, tuple) else shape,
        "datatype": datatype,
        "data": values,
    }


def _raw_json(cid: str, value: bytes, *, correlation_header: bool = True) -> Send:
    headers: Headers = list(JSON_CT) + ([("correlation-id", cid.encode())] if correlation_header else [])
    return Send(value, headers, cid.encode())


def _pb_message(cid: str, inputs: list[tuple[str, str, list[int], bytes]], **fields: Any) -> Send:
    """A hand-built ModelInferRequest: (name, datatype, shape, raw bytes) per input."""
    message = pb.ModelInferRequest(id=cid, **fields)
    for name, datatype, shape, raw in inputs:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_input_contents.append(raw)
    return Send(message.SerializeToString(), list(PB_CT) + [("correlation-id", cid.encode())], cid.encode())


def _row(n: int = 16) -> bytes:
    return FEATURES[0, :n].astype("<f4").tobytes()


def _dense_kinds() -> list[Kind]:
    now = int(time.time() * 1000)
    k: list[Kind] = []

    def add(name: str, send: Send | list[Send], expect: Expect) -> None:
        k.append(Kind("dense", name, [_probe(send, expect)]))

    add("valid protobuf request (control)", _pb("hd-valid-pb"), RESULT)
    add("valid JSON request (control)", _js("hd-valid-json", rows=3), RESULT)
    add("empty value", replace(_pb("hd-empty"), value=b""), dead("empty-value", stage="classify"))
    add("null value (tombstone)", replace(_pb("hd-null"), value=None), dead("empty-value", stage="classify"))
    over = _json_body("hd-over", [])
    over += b" " * (DENSE_LIMIT + 1 - len(over))
    add("value of max_request_bytes + 1", _raw_json("hd-over", over), dead("oversized-value", stage="classify"))
    large = _js("hd-3mib")
    add("valid 3 MiB request", replace(large, value=(large.value or b"") + b" " * (3 * MiB)), RESULT)
    add(
        "header value of 2 MiB on a valid request",
        replace(_pb("hd-hdr-2mib"), headers=_with_headers(_pb("hd-hdr-2mib").headers, ("x-big", b"b" * (2 * MiB)))),
        RESULT,
    )
    fits = _pb("hd-hdr-5mib")
    record_limit = RecordLimits.for_values(DENSE_LIMIT, dead_letter_max_bytes=MiB).max_record_bytes
    add(
        "header value filling the request to just under the record limit (5 MiB): result over it",
        replace(fits, headers=filled(fits.key, fits.value, list(fits.headers), "x-big", record_limit)),
        dead("result-too-large", stage="classify"),
    )
    add(
        "header value of 2 MiB on a bad request (dead letter over 1 MiB)",
        replace(_raw_json("hd-hdr-bad", b"[1, 2, 3]"), headers=[*JSON_CT, ("x-big", b"z" * (2 * MiB))]),
        dead("malformed-request", stage="classify"),
    )
    many = _pb("hd-many-headers")
    add(
        "10,000 headers",
        replace(many, headers=many.headers + [(f"x-h{i}", str(i).encode()) for i in range(10_000)]),
        RESULT,
    )
    add(
        "header value not UTF-8 (application header)",
        replace(_pb("hd-hdr-latin"), headers=_with_headers(_pb("hd-hdr-latin").headers, ("x-app", b"\xff\xfe\x80"))),
        RESULT,
    )
    add(
        "correlation-id header not UTF-8",
        replace(_pb("hd-cid-latin"), headers=[*PB_CT, ("correlation-id", b"\xff\xfe")]),
        dead("bad-header", stage="classify"),
    )
    add(
        "header key not UTF-8",
        replace(_pb("hd-key-latin"), raw_header_key=b"\xff\xfe"),
        dead("unreadable-record", stage="classify"),
    )
    add(
        "null header value (application header)",
        replace(_pb("hd-hdr-null"), headers=_with_headers(_pb("hd-hdr-null").headers, ("x-null", None))),
        RESULT,
    )
    add(
        "null content-type value",
        replace(
            _pb("hd-ct-null"),
            headers=_with_headers(_pb("hd-ct-null").headers, ("content-type", None), drop=["content-type"]),
        ),
        dead("missing-content-type", stage="classify"),
    )
    add(
        "missing content-type",
        replace(_pb("hd-ct-missing"), headers=_with_headers(_pb("hd-ct-missing").headers, drop=["content-type"])),
        dead("missing-content-type", stage="classify"),
    )
    add(
        "unknown content-type",
        replace(
            _pb("hd-ct-text"),
            headers=_with_headers(_pb("hd-ct-text").headers, ("content-type", b"text/plain"), drop=["content-type"]),
        ),
        dead("unsupported-content-type", stage="classify"),
    )
    add(
        "content-type with case and charset",
        replace(
            _js("hd-ct-charset"),
            headers=_with_headers(
                _js("hd-ct-charset").headers,
                ("content-type", b"Application/JSON; charset=utf-8"),
                drop=["content-type"],
            ),
        ),
        RESULT,
    )
    add(
        "content-type repeated with different values",
        replace(
            _pb("hd-ct-twice"), headers=_with_headers(_pb("hd-ct-twice").headers, ("content-type", b"application/json"))
        ),
        dead("bad-header", stage="classify"),
    )
    valid_pb = _pb("hd-truncated")
    add(
        "truncated protobuf",
        replace(valid_pb, value=(valid_pb.value or b"")[:-7]),
        dead("malformed-request", stage="classify"),
    )
    noise = np.random.default_rng(4).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    add(
        "random bytes as protobuf",
        replace(_pb("hd-random-pb"), value=b"\xff" + noise),
        dead("malformed-request", stage="classify"),
    )
    add(
        "random bytes as JSON",
        _raw_json("hd-random-json", b"\xff" + noise),
        dead("malformed-request", stage="classify"),
    )
    response = pb.ModelInferResponse(id="hd-response", model_name="dense_classifier")
    response.outputs.add(name="logits", datatype="FP32", shape=[1, 4])
    response.raw_output_contents.append(np.zeros(4, "<f4").tobytes())
    add(
        "protobuf of the wrong message type (a response)",
        replace(_pb("hd-response"), value=response.SerializeToString()),
        dead("malformed-request", stage="classify"),
    )
    add(
        "protobuf of another message type (server metadata)",
        replace(_pb("hd-metadata"), value=pb.ServerMetadataResponse(name="triton", version="2.51").SerializeToString()),
        dead("missing-input", stage="classify"),
    )
    add(
        "JSON that is not an object",
        _raw_json("hd-json-array", b"[1, 2, 3]"),
        dead("malformed-request", stage="classify"),
    )
    deep = b'{"id": "hd-deep", "inputs": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    add("JSON nested 10,000 levels", _raw_json("hd-deep", deep), dead("malformed-request", stage="classify"))
    rows = (DENSE_LIMIT - 4096) // (16 * 4)
    huge = _json_body("hd-huge-array", [_json_tensor(shape=(rows, 16), data=[0.5] * (rows * 16))]).replace(b", ", b",")
    assert DENSE_LIMIT - 8192 < len(huge) <= DENSE_LIMIT, len(huge)
    add(
        "JSON array of a million numbers, just under the limit",
        _raw_json("hd-huge-array", huge),
        dead("batch-too-large", "oversized-value", stage="classify"),
    )
    nan_data = [float("nan"), float("inf"), float("-inf"), *FEATURES[0, 3:].tolist()]
    add(
        "JSON with NaN and Infinity numbers",
        _raw_json("hd-nan", _json_body("hd-nan", [_json_tensor(data=nan_data)])),
        RESULT,
    )
    add(
        "JSON integer literal of 5,000 digits",
        _raw_json(
            "hd-digits",
            b'{"id": "hd-digits", "inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": ['
            + b"9" * 5000
            + b"]}]}",
        ),
        dead("malformed-request", stage="classify"),
    )
    add(
        "JSON with an unknown key",
        _raw_json("hd-unknown-key", _json_body("hd-unknown-key", [_json_tensor()], input=[])),
        dead("malformed-request", stage="classify"),
    )
    add(
        "JSON with a repeated key",
        _raw_json("hd-repeated-key", b'{"id": "hd-repeated-key", "id": "x", "inputs": []}'),
        dead("malformed-request", stage="classify"),
    )
    add(
        "JSON that is not UTF-8",
        _raw_json("hd-json-latin", b'{"id": "hd-json-latin\xff", "inputs": []}'),
        dead("malformed-request", stage="classify"),
    )
    add(
        "wrong datatype (INT32 for FP32)",
        _pb_message("hd-int32", [("features", "INT32", [1, 16], np.zeros(16, "<i4").tobytes())]),
        dead("datatype-mismatch", stage="classify"),
    )
    add(
        "unknown datatype name",
        _pb_message("hd-fp8", [("features", "FP8", [1, 16], _row())]),
        dead("datatype-mismatch", stage="classify"),
    )
    add(
        "negative dimension",
        _pb_message("hd-negative", [("features", "FP32", [-1, 16], _row())]),
        dead("shape-mismatch", stage="classify"),
    )
    add(
        "2^40 elements declared",
        _pb_message("hd-2e40", [("features", "FP32", [1 << 20, 1 << 20], _row())]),
        dead("oversized-value", stage="classify"),
    )
    add(
        "zero-size batch [0, 16]",
        _pb_message("hd-zero", [("features", "FP32", [0, 16], b"")]),
        dead("shape-mismatch", stage="classify"),
    )
    add(
        "33 dimensions",
        _pb_message("hd-33-dims", [("features", "FP32", [1] * 33, _row(1))]),
        dead("shape-mismatch", stage="classify"),
    )
    add(
        "non-integer dimension (JSON 1.5)",
        _raw_json("hd-dim-float", _json_body("hd-dim-float", [_json_tensor(shape=[1.5, 16])])),
        dead("shape-mismatch", stage="classify"),
    )
    add(
        "raw data shorter than the shape (15 of 16 floats)",
        _pb_message("hd-raw-short", [("features", "FP32", [1, 16], _row(15))]),
        dead("data-size-mismatch", stage="classify"),
    )
    add(
        "JSON data longer than the shape (17 for 16)",
        _raw_json("hd-json-long", _json_body("hd-json-long", [_json_tensor(data=[*FEATURES[0].tolist(), 1.0])])),
        dead("data-size-mismatch", stage="classify"),
    )
    add(
        "row shape [1, 15] for [16]",
        _pb_message("hd-row-15", [("features", "FP32", [1, 15], _row(15))]),
        dead("shape-mismatch", stage="classify"),
    )
    add("batch of 65 rows (max 64)", _pb("hd-batch-65", rows=65), dead("batch-too-large", stage="classify"))
    add("unknown model", _pb("hd-unknown-model", model_name="no_such_model"), dead("unknown-model", stage="classify"))
    add(
        "unknown model version",
        _pb("hd-version-99", model_name="dense_classifier", model_version="99"),
        dead("unknown-model", "model-version-mismatch", "model-unavailable", stage="classify"),
    )
    add(
        "unknown input",
        _pb_message("hd-unknown-input", [("features", "FP32", [1, 16], _row()), ("bogus", "FP32", [1, 16], _row())]),
        dead("unknown-input", stage="classify"),
    )
    add(
        "duplicate input",
        _pb_message("hd-dup-input", [("features", "FP32", [1, 16], _row()), ("features", "FP32", [1, 16], _row())]),
        dead("duplicate-input", stage="classify"),
    )
    no_id = _raw_json("hd-no-id", _json_body(None, [_json_tensor()]), correlation_header=False)
    add("missing correlation id", no_id, dead("missing-correlation-id", stage="classify"))
    add(
        "correlation-id header conflicting with the body id",
        replace(
            _pb("hd-conflict"),
            headers=_with_headers(_pb("hd-conflict").headers, ("correlation-id", b"other"), drop=["correlation-id"]),
        ),
        dead("conflicting-correlation-id", stage="classify"),
    )
    add(
        "correlation id of 300 characters",
        replace(
            _pb("hd-long-cid"),
            headers=_with_headers(_pb("hd-long-cid").headers, ("correlation-id", b"c" * 300), drop=["correlation-id"]),
        ),
        dead("bad-header", stage="classify"),
    )
    add(
        "deadline already passed",
        _pb("hd-deadline-past", deadline_ms=now - 60_000),
        dead("deadline-exceeded", stage="classify"),
    )
    for name, value in [("deadline", b"tomorrow"), ("priority", b"-1"), ("timeout-ms", b"0")]:
        cid = f"hd-bad-{name}"
        add(
            f"bad {name} header ({value.decode()})",
            replace(_pb(cid), headers=_with_headers(_pb(cid).headers, (name, value))),
            dead("bad-header", stage="classify"),
        )
    add(
        "priority header disagreeing with the priority parameter",
        replace(
            _pb("hd-priority-both", parameters={"priority": 2}),
            headers=_with_headers(_pb("hd-priority-both").headers, ("priority", b"1")),
        ),
        dead("bad-header", stage="classify"),
    )
    add(
        "unknown requested output",
        _pb("hd-unknown-output", requested_outputs=["nope"]),
        dead("unknown-output", stage="classify"),
    )
    shm = pb.ModelInferRequest(id="hd-shm")
    tensor = shm.inputs.add(name="features", datatype="FP32", shape=[1, 16])
    tensor.parameters["shared_memory_region"].string_param = "region0"
    add(
        "shared-memory tensor parameter",
        Send(shm.SerializeToString(), [*PB_CT, ("correlation-id", b"hd-shm")], b"hd-shm"),
        dead("malformed-request", stage="classify"),
    )
    typed = pb.ModelInferRequest(id="hd-typed-int")
    tensor = typed.inputs.add(name="features", datatype="FP32", shape=[1, 16])
    tensor.contents.int_contents.extend(range(16))
    add(
        "typed contents in the wrong field (int_contents for FP32)",
        Send(typed.SerializeToString(), [*PB_CT, ("correlation-id", b"hd-typed-int")], b"hd-typed-int"),
        dead("datatype-mismatch", stage="classify"),
    )
    two_raw = _pb_message("hd-two-raw", [("features", "FP32", [1, 16], _row())])
    message = pb.ModelInferRequest.FromString(two_raw.value or b"")
    message.raw_input_contents.append(_row())
    add(
        "two raw contents for one input",
        replace(two_raw, value=message.SerializeToString()),
        dead("malformed-request", stage="classify"),
    )
    add("null key on a valid request", replace(_pb("hd-null-key"), key=None), RESULT)
    add("key of 512 KiB on a valid request", replace(_pb("hd-long-key"), key=b"k" * (512 * 1024)), RESULT)
    add("malformed traceparent", _pb("hd-traceparent", traceparent="00-zz-not-a-trace"), RESULT)
    add(
        "sequence_start without a sequence_id",
        _pb("hd-seq-start", parameters={"sequence_start": True}),
        dead("malformed-request", stage="classify"),
    )
    return k


# --------------------------------------------------------------------------- audio kinds


def _noise(n: int, seed: int, scale: float = 0.05) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


_MISSING = object()


def _chunk(
    key: str,
    index: object,
    samples: Any,
    *,
    start: bool | None = None,
    end: bool = False,
    form: str = "protobuf",
    rate: int | None = SR,
    cid: str | None = None,
    timestamp_ms: int | None = None,
    sequence: bool = True,
) -> Send:
    """One chunk record: PCM (``samples`` an array) or a WAV file (``samples`` bytes)."""
    params: dict[str, Any] = {}
    if index is not _MISSING:
        params["chunk_index"] = index
    if rate is not None and not isinstance(samples, bytes):
        params["sample_rate"] = rate
    if isinstance(samples, bytes):
        tensor: Any = np.array([samples], dtype=object)
    else:
        array = np.asarray(samples)
        tensor = array[None, :] if array.ndim == 1 else array
    record = encode_request(
        {"audio": tensor},
        correlation_id=cid or f"{key}/{index if index is not _MISSING else 'x'}",
        form=form,
        parameters=params,
        sequence_id=key if sequence else None,
        sequence_start=(index == 0) if start is None else start,
        sequence_end=end,
        key=key,
    )
    return _send(record, timestamp_ms=timestamp_ms)


def _wav(samples: np.ndarray, bits: int = 16, rate: int = SR, *, tag: int = WAVE_FORMAT_PCM) -> bytes:
    if tag == WAVE_FORMAT_IEEE_FLOAT:
        payload = samples.astype("<f4").tobytes()
        return canonical_wav(tag, 1, rate, 32, payload)
    if bits == 8:
        payload = np.clip(np.round(samples * 127 + 128), 0, 255).astype(np.uint8).tobytes()
    elif bits == 16:
        payload = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2").tobytes()
    else:
        values = np.clip(np.round(samples * (2**23 - 1)), -(2**23), 2**23 - 1).astype("<i4")
        payload = b"".join(v.tobytes()[:3] for v in values)
    return canonical_wav(WAVE_FORMAT_PCM, 1, rate, bits, payload)


def _audio_kinds() -> list[Kind]:
    k: list[Kind] = []
    later = int(time.time() * 1000) + YEAR_MS

    def frames(seed: int, n: int = 1) -> np.ndarray:
        return _noise(FRAME * n, seed)

    def stream(name: str, key: str, items: list[Item]) -> None:
        k.append(Kind("audio", name, items))

    def single(name: str, send: Send, expect: Expect) -> None:
        stream(name, send.key.decode() if send.key else name, [_probe(send, expect)])

    bad_pre = dead("malformed-request", stage="preprocess")
    bad_vad = dead("malformed-request", stage="vad")

    key = "ha-valid"
    stream(
        "valid stream of 3 chunks (control)",
        key,
        [_probe(_chunk(key, i, frames(i), end=i == 2), RESULT) for i in range(3)],
    )
    key = "ha-wav16"
    stream(
        "valid 16-bit WAV chunks (control)",
        key,
        [_probe(_chunk(key, i, _wav(frames(10 + i)), end=i == 1), RESULT) for i in range(2)],
    )
    for name, value in [("NaN", float("nan")), ("Inf", float("inf"))]:
        key = f"ha-{name.lower()}"
        bad = frames(20).copy()
        bad[100] = value
        stream(
            f"{name} samples in FP32 PCM",
            key,
            [
                _context(_chunk(key, 0, frames(21))),
                _probe(_chunk(key, 1, bad), bad_pre),
                _context(_chunk(key, 2, frames(22), end=True)),
            ],
        )
    single("chunk far too long (11 s)", _chunk("ha-too-long", 0, _noise(11 * SR, 30), end=True), bad_pre)
    single("chunk 0 without sequence_start", _chunk("ha-no-start", 0, frames(31), start=False), bad_vad)
    key = "ha-after-end"
    stream(
        "chunks after sequence_end",
        key,
        [
            _context(_chunk(key, 0, frames(32))),
            _context(_chunk(key, 1, frames(33), end=True)),
            _probe(_chunk(key, 2, frames(34)), bad_vad),
        ],
    )
    key = "ha-reused"
    stream(
        "stream key reused after its end (a new stream)",
        key,
        [
            _context(_chunk(key, 0, frames(35))),
            _context(_chunk(key, 1, frames(36), end=True)),
            _probe(_chunk(key, 0, frames(37), cid=f"{key}/0b"), RESULT),
            _probe(_chunk(key, 1, frames(38), cid=f"{key}/1b", end=True), RESULT),
        ],
    )
    key = "ha-replay-0"
    first = _chunk(key, 0, frames(39))
    stream(
        "replay of an ended stream's chunk 0",
        key,
        [
            _context(first),
            _context(_chunk(key, 1, frames(40), end=True)),
            _probe(replace(first), drop("duplicate-chunk", "vad")),
        ],
    )
    key = "ha-gap"
    stream(
        "chunk index gap (0, 1, 3)",
        key,
        [
            _context(_chunk(key, 0, frames(41))),
            _context(_chunk(key, 1, frames(42))),
            _probe(_chunk(key, 3, frames(43), end=True), RESULT),
        ],
    )
    key = "ha-dup-same"
    one = _chunk(key, 1, frames(45))
    stream(
        "duplicate chunk index, same bytes",
        key,
        [
            _context(_chunk(key, 0, frames(44))),
            _context(one),
            _probe(replace(one), drop("duplicate-chunk", "vad")),
            _context(_chunk(key, 2, frames(46), end=True)),
        ],
    )
    key = "ha-dup-other"
    stream(
        "duplicate chunk index, other bytes",
        key,
        [
            _context(_chunk(key, 0, frames(47))),
            _context(_chunk(key, 1, frames(48))),
            _probe(_chunk(key, 1, frames(49)), bad_vad),
            _context(_chunk(key, 2, frames(50), end=True)),
        ],
    )
    for name, index, form in [
        ("negative chunk_index", -1, "protobuf"),
        ("non-integer chunk_index (1.5)", 1.5, "protobuf"),
        ("chunk_index Infinity", float("inf"), "json"),
        ("chunk_index a string", "one", "protobuf"),
        ("chunk_index missing", _MISSING, "protobuf"),
    ]:
        key = "ha-index-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        stream(
            name,
            key,
            [
                _context(_chunk(key, 0, frames(51))),
                _probe(_chunk(key, index, frames(52), start=False, end=True, form=form), bad_vad),
            ],
        )
    key = "ha-future"
    stream(
        "record timestamps a year ahead",
        key,
        [_probe(_chunk(key, i, frames(60 + i), end=i == 2, timestamp_ms=later), RESULT) for i in range(3)],
    )
    lying = bytearray(_wav(frames(63)))
    struct.pack_into("<I", lying, 40, len(lying) - 44 + 4096)  # the data chunk claims 4 KiB more than follows
    single("WAV whose data size lies", _chunk("ha-wav-lie", 0, bytes(lying), end=True), bad_pre)
    single(
        "WAV whose header says 8 kHz for 16 kHz samples",
        _chunk("ha-wav-rate", 0, _wav(frames(64), rate=8000), end=True),
        RESULT,
    )
    single("8-bit PCM WAV", _chunk("ha-wav8", 0, _wav(frames(65), bits=8), end=True), RESULT)
    single("24-bit PCM WAV", _chunk("ha-wav24", 0, _wav(frames(66), bits=24), end=True), RESULT)
    single("float WAV", _chunk("ha-wavf", 0, _wav(frames(67), tag=WAVE_FORMAT_IEEE_FLOAT), end=True), RESULT)
    block = bytearray(wav_header(WAVE_FORMAT_PCM, 1, SR, 16, 1024) + bytes(1024))
    struct.pack_into("<H", block, 32, 3)  # block align 3 for one 16-bit channel
    single("WAV whose block align lies", _chunk("ha-wav-align", 0, bytes(block), end=True), bad_pre)
    single("random bytes as a WAV", _chunk("ha-wav-noise", 0, b"RIFF" + bytes(range(200)), end=True), bad_pre)
    pcm16 = np.round(frames(68) * 32767).astype(np.int16)
    single("INT16 PCM without sample_rate", _chunk("ha-no-rate", 0, pcm16, rate=None, end=True), bad_pre)
    single("sample_rate of 1 MHz", _chunk("ha-rate-1mhz", 0, pcm16, rate=1_000_000, end=True), bad_pre)
    single("zero samples", _chunk("ha-zero", 0, np.zeros(0, np.float32), end=True), bad_pre)
    single("8 kHz INT16 PCM (resampled)", _chunk("ha-8khz", 0, pcm16, rate=8000, end=True), RESULT)
    single(
        "stereo PCM [samples, 2]", _chunk("ha-stereo", 0, np.stack([frames(69), frames(70)], axis=1), end=True), RESULT
    )
    single("nine channels", _chunk("ha-9ch", 0, np.zeros((FRAME, 9), np.float32), end=True), bad_pre)
    single(
        "INT16 value out of range (JSON 40000)",
        _out_of_range(_chunk("ha-int16-range", 0, pcm16, form="json", end=True)),
        dead("datatype-mismatch", stage="preprocess"),
    )
    single(
        "INT32 samples",
        _chunk("ha-int32", 0, np.zeros(FRAME, np.int32), end=True),
        dead("datatype-mismatch", stage="preprocess"),
    )
    single(
        "sequence_start without a sequence_id",
        replace(
            _chunk("ha-no-seq-id", 0, frames(71), sequence=False),
            value=_seq_start_without_id("ha-no-seq-id/0", frames(71)),
        ),
        dead("malformed-request", stage="preprocess"),
    )
    single(
        "empty value",
        replace(_chunk("ha-empty", 0, frames(72), end=True), value=b""),
        dead("empty-value", stage="preprocess"),
    )
    single("chunk with no key", replace(_chunk("ha-no-key", 0, frames(73), end=True), key=None), bad_vad)
    key = "ha-far-ahead"
    stream(
        "chunk index far ahead of the reorder window (0, 40)",
        key,
        [_context(_chunk(key, 0, frames(74))), _probe(_chunk(key, 40, frames(75), end=True), RESULT)],
    )
    key = "ha-late-after-skip"
    stream(
        "chunk arriving after its index was skipped as a gap (0, 20, then 5)",
        key,
        [
            _context(_chunk(key, 0, frames(79))),
            _context(_chunk(key, 20, frames(80))),
            _probe(_chunk(key, 5, frames(81), end=True), bad_vad),
        ],
    )
    single(
        "one sample at 192 kHz",
        _chunk("ha-one-sample", 0, np.array([0.1], np.float32), rate=192_000, end=True),
        ONE_OUTCOME,
    )
    key = "ha-index-header"
    header_chunk = _chunk(key, _MISSING, frames(77), start=False, end=True, cid=f"{key}/1")
    stream(
        "chunk-index header instead of the parameter",
        key,
        [
            _context(_chunk(key, 0, frames(76))),
            _probe(replace(header_chunk, headers=header_chunk.headers + [("chunk-index", b"1")]), RESULT),
        ],
    )
    single(
        "header key not UTF-8",
        replace(_chunk("ha-key-latin", 0, frames(78), end=True), raw_header_key=b"\xc3\x28"),
        dead("unreadable-record", stage="preprocess"),
    )
    return k


def _out_of_range(send: Send) -> Send:
    """The same JSON chunk with one INT16 sample of 40000."""
    body = json.loads(send.value or b"")
    body["inputs"][0]["data"][0] = 40000
    return replace(send, value=json.dumps(body).encode())


def _seq_start_without_id(cid: str, samples: np.ndarray) -> bytes:
    return encode_request(
        {"audio": samples[None, :]},
        correlation_id=cid,
        parameters={"chunk_index": 0, "sample_rate": SR, "sequence_start": True},
    ).value


# --------------------------------------------------------------------------- ensemble kinds


def _branch(
    cid: str, branch: str, seed: int, *, key: bytes | object | None = _MISSING, timestamp_ms: int | None = None
) -> Send:
    """A branch record as the classify or score step writes it (a request carrying the tensors so far)."""
    raw = random_features(1, seed)
    features = norm_reference(raw).astype(np.float32)
    tensors = {"raw": raw, "features": features}
    if branch == "classify":
        tensors["logits"] = mlp_reference(features).astype(np.float32)
    else:
        tensors["score"] = score_reference(features).astype(np.float32)
    record = encode_request(tensors, correlation_id=cid)
    return _send(record, topic=f"{branch}.out", key=cid.encode() if key is _MISSING else key, timestamp_ms=timestamp_ms)


def _ensemble_request(cid: str, seed: int, **kw: Any) -> Send:
    return _send(encode_request({"raw": random_features(1, seed)}, correlation_id=cid, **kw))


def _ensemble_kinds() -> list[Kind]:
    k: list[Kind] = []
    later = int(time.time() * 1000) + YEAR_MS

    def add(name: str, items: list[Item]) -> None:
        k.append(Kind("ensemble", name, items))

    add("valid request (control)", [_probe(_ensemble_request("he-valid", 1), RESULT)])
    add(
        "request without the graph's input tensor",
        [
            _probe(
                _send(encode_request({"features": random_features(1, 2)}, correlation_id="he-no-raw")),
                dead("missing-input", "unknown-input", stage="normalise"),
            )
        ],
    )
    add(
        "empty value",
        [_probe(replace(_ensemble_request("he-empty", 3), value=b""), dead("empty-value", stage="normalise"))],
    )
    add(
        "correlation-id header conflicting with the body id",
        [
            _probe(
                replace(_ensemble_request("he-conflict", 4), headers=[*PB_CT, ("correlation-id", b"he-other")]),
                dead("conflicting-correlation-id", stage="normalise"),
            )
        ],
    )
    add(
        "same correlation id reused with another payload",
        [
            _context(_ensemble_request("he-reused", 5)),
            _probe(
                _ensemble_request("he-reused", 6), dead("conflicting-correlation-id", stage="join-result", count=(1, 2))
            ),
        ],
    )
    add(
        "valid request with a null key",
        [
            _probe(
                replace(_ensemble_request("he-null-key", 7), key=None),
                dead("missing-correlation-id", stage="join-result", count=(1, 2)),
            )
        ],
    )
    add(
        "branch record with no key",
        [
            _probe(
                _branch("he-branch-no-key", "classify", 8, key=None),
                dead("missing-correlation-id", stage="join-result"),
            )
        ],
    )
    add(
        "branch record duplicated (same bytes)",
        [
            Item(
                [
                    _branch("he-branch-dup", "classify", 9),
                    _branch("he-branch-dup", "classify", 9),
                    _branch("he-branch-dup", "score", 9),
                ],
                Expect(results=1, drops=1, drop_reason="join-duplicate", stage="join-result"),
            )
        ],
    )
    add(
        "branch record whose partner never comes",
        [_probe(_branch("he-branch-alone", "score", 10), dead("deadline-exceeded", stage="join-result"))],
    )
    add(
        "future-dated branch record whose partner never comes",
        [
            _probe(
                _branch("he-future-alone", "classify", 11, timestamp_ms=later),
                dead("deadline-exceeded", stage="join-result"),
            )
        ],
    )
    add(
        "future-dated branch records of one join",
        [
            Item(
                [
                    _branch("he-future-pair", "classify", 12, timestamp_ms=later),
                    _branch("he-future-pair", "score", 12, timestamp_ms=later),
                ],
                RESULT,
            )
        ],
    )
    add(
        "request timestamped a year ahead",
        [_probe(replace(_ensemble_request("he-future", 13), timestamp_ms=later), RESULT)],
    )
    garbage = replace(_branch("he-branch-garbage", "classify", 14), value=b"\xff\x00garbage")
    add(
        "branch record with a garbage value",
        [Item([garbage, _branch("he-branch-garbage", "score", 14)], dead("malformed-request", stage="join-result"))],
    )
    add(
        "header key not UTF-8",
        [
            _probe(
                replace(_ensemble_request("he-key-latin", 15), raw_header_key=b"\xe2\x82"),
                dead("unreadable-record", stage="normalise"),
            )
        ],
    )
    return k


@functools.cache
def kinds() -> list[Kind]:
    """Every hostile kind, built once (some hold several MiB)."""
    return _dense_kinds() + _audio_kinds() + _ensemble_kinds()


def markdown_table(selected: Sequence[Kind]) -> str:
    """The table of docs/message-contract.md, "Hostile input campaign"."""
    lines = ["| topology | kind | records | expected outcome of the hostile record |", "|---|---|---|---|"]
    for kind in selected:
        records = sum(len(i.sends) for i in kind.items)
        expects = sorted({i.expect.describe() for i in kind.probes})
        lines.append(f"| {kind.topology} | {kind.name} | {records} | {'; '.join(expects)} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- fuzz


CONTENT_TYPES: list[bytes | None] = [
    b"application/json",
    b"application/x-protobuf",
    b"application/vnd.oip.v2.infer-request+protobuf",
    b"application/json; charset=utf-8",
    b"text/plain",
    b"",
    b"\xff\xfe",
    None,
]
INT_HEADER_VALUES = [b"", b"-1", b"0", b"abc", b"99999999999999999999999", b"1.5", b"\xff"]


def _mutate_bytes(rng: np.random.Generator, value: bytes, donors: Sequence[bytes]) -> bytes:
    data = bytearray(value)
    n = len(data)
    op = int(rng.integers(0, 9))
    if n == 0 or op == 0:  # bit flips
        for _ in range(int(rng.integers(1, 17))):
            if data:
                pos = int(rng.integers(0, len(data)))
                data[pos] ^= 1 << int(rng.integers(0, 8))
    elif op == 1:  # truncation
        del data[int(rng.integers(0, n)) :]
    elif op == 2:  # a span duplicated
        a = int(rng.integers(0, n))
        b = min(n, a + int(rng.integers(1, 256)))
        c = int(rng.integers(0, n + 1))
        data[c:c] = data[a:b]
    elif op == 3:  # a span deleted
        a = int(rng.integers(0, n))
        del data[a : a + int(rng.integers(1, 64))]
    elif op == 4:  # a span overwritten with random bytes
        a = int(rng.integers(0, n))
        span = rng.integers(0, 256, int(rng.integers(1, 32)), dtype=np.uint8).tobytes()
        data[a : a + len(span)] = span
    elif op == 5:  # spliced with another record
        donor = donors[int(rng.integers(0, len(donors)))]
        data = data[: int(rng.integers(0, n))] + donor[int(rng.integers(0, max(1, len(donor)))) :]
    elif op == 6:  # a JSON/text token swapped for a hostile one
        text = bytes(data)
        token = [b"NaN", b"Infinity", b"-1", b"1e999", b"null", b"[[[[", b'"', b"9" * 400, b"{}", b"\x00"][
            int(rng.integers(0, 10))
        ]
        a = int(rng.integers(0, n))
        data = bytearray(text[:a] + token + text[a + int(rng.integers(0, 8)) :])
    elif op == 7:  # emptied
        data = bytearray()
    else:  # bytes appended
        data += rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    return bytes(data)


def _mutate_headers(rng: np.random.Generator, headers: Headers) -> Headers:
    out = list(headers)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 9))
        if op == 0:
            out = [(k, v) for k, v in out if k != "content-type"]
        elif op == 1:
            out = [(k, v) for k, v in out if k != "content-type"] + [
                ("content-type", CONTENT_TYPES[int(rng.integers(0, len(CONTENT_TYPES)))])
            ]
        elif op == 2:
            out = [(k, v) for k, v in out if k != "correlation-id"]
            choice = int(rng.integers(0, 4))
            if choice:
                out.append(("correlation-id", [b"\xff\xfe", b"x" * 300, b"fuzz-other", b"tab\there"][choice]))
        elif op == 3:
            name = ["deadline", "priority", "timeout-ms"][int(rng.integers(0, 3))]
            out.append((name, INT_HEADER_VALUES[int(rng.integers(0, len(INT_HEADER_VALUES)))]))
        elif op == 4:
            value = (
                None if rng.random() < 0.3 else rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8).tobytes()
            )
            out.append((f"x-fuzz-{int(rng.integers(0, 1000))}", value))
        elif op == 5 and out:  # a header repeated with another value
            k, v = out[int(rng.integers(0, len(out)))]
            if k != SEQ:
                out.append((k, (v or b"") + b"-2"))
        elif op == 6:
            out += [(f"x-many-{i}", b"v") for i in range(int(rng.integers(100, 3000)))]
        elif op == 7:
            out.append(("x-large", b"L" * int(rng.integers(64 * 1024, int(1.5 * MiB)))))
        else:
            out.append(("traceparent", rng.integers(32, 127, 55, dtype=np.uint8).tobytes()))
    return out


def _mutate_key(rng: np.random.Generator, key: bytes | None, keys: Sequence[bytes]) -> bytes | None:
    op = int(rng.integers(0, 5))
    if op == 0:
        return None
    if op == 1:
        return b""
    if op == 2:
        return rng.integers(0, 256, int(rng.integers(1, 33)), dtype=np.uint8).tobytes()
    if op == 3:
        return b"K" * 10_000
    return keys[int(rng.integers(0, len(keys)))]


def _fuzz_one(
    rng: np.random.Generator,
    send: Send,
    donors: Sequence[bytes],
    keys: Sequence[bytes],
    *,
    value_p: float,
    header_p: float,
    key_p: float,
) -> Send:
    value = send.value or b""
    if rng.random() < value_p:
        value = _mutate_bytes(rng, value, donors)
    headers = _mutate_headers(rng, send.headers) if rng.random() < header_p else send.headers
    key = _mutate_key(rng, send.key, keys) if rng.random() < key_p else send.key
    stamp = None
    if rng.random() < 0.03:
        stamp = int(time.time() * 1000) + [YEAR_MS, -YEAR_MS, -int(time.time() * 1000) + 1][int(rng.integers(0, 3))]
    bad_key = bytes([0xFF, int(rng.integers(0x80, 0xFF))]) if rng.random() < 0.004 else None
    return Send(value, headers, key, timestamp_ms=stamp, raw_header_key=bad_key)


def _resize(rng: np.random.Generator, sends: list[Send], limit: int, count: int) -> None:
    """``count`` JSON records padded to the limit + 1 (oversized) and ``count`` to just under it."""
    json_indices = [i for i, s in enumerate(sends) if (s.value or b"").startswith(b"{")]
    chosen = rng.choice(json_indices, size=2 * count, replace=False)
    for n, i in enumerate(chosen):
        value = sends[int(i)].value or b""
        target = limit + 1 if n < count else limit - int(rng.integers(0, 4096))
        sends[int(i)] = replace(sends[int(i)], value=value + b" " * max(0, target - len(value)))


def fuzz_dense(rng: np.random.Generator, n: int) -> list[Send]:
    bases: list[Send] = []
    for i in range(n):
        rows = int(rng.integers(1, 5))
        start = int(rng.integers(0, 100))
        form = ["protobuf", "json", "typed"][int(rng.integers(0, 3))]
        record = encode_request(
            {"features": FEATURES[start : start + rows]},
            correlation_id=f"fz-d-{i}",
            form="json" if form == "json" else "protobuf",
            typed_contents=form == "typed",
        )
        bases.append(_send(record))
    donors = [b.value or b"" for b in bases[:64]]
    keys = [b.key or b"" for b in bases[:64]]
    sends = [_fuzz_one(rng, b, donors, keys, value_p=0.55, header_p=0.3, key_p=0.15) for b in bases]
    _resize(rng, sends, DENSE_LIMIT, 3)
    return sends


def fuzz_audio(rng: np.random.Generator, n: int) -> list[Send]:
    streams: list[list[Send]] = []
    total = 0
    s = 0
    while total < n:
        key = f"fz-a-{s}"
        length = int(rng.integers(2, 14))
        form = ["protobuf", "json", "wav"][int(rng.integers(0, 3))]
        chunks = []
        for i in range(length):
            samples = _noise(FRAME if form != "json" else FRAME // 2, seed=int(rng.integers(0, 1 << 30)))
            if form == "wav":
                chunks.append(_chunk(key, i, _wav(samples), end=i == length - 1))
            elif form == "json":
                pcm = np.round(samples * 32767).astype(np.int16)
                chunks.append(_chunk(key, i, pcm, form="json", end=i == length - 1))
            else:
                chunks.append(_chunk(key, i, samples, end=i == length - 1))
        streams.append(chunks)
        total += length
        s += 1
    ordered: list[Send] = [c for group in itertools.zip_longest(*streams) for c in group if c is not None][:n]
    donors = [c.value or b"" for c in ordered[:64]]
    keys = [f"fz-a-{j}".encode() for j in range(s)]
    out: list[Send] = []
    for send in ordered:
        r = rng.random()
        if r < 0.05:  # an exact copy follows (a duplicate chunk: dropped, counted)
            out += [send, replace(send)]
        elif r < 0.10:  # the chunk's parameters changed: index, flags
            body = encode_request(
                {"audio": np.zeros((1, FRAME), np.float32) + np.float32(rng.random() * 0.01)},
                correlation_id=f"fz-p-{len(out)}",
                parameters={"chunk_index": int(rng.integers(-2, 40)), "sample_rate": SR},
                sequence_id=(send.key or b"x").decode("utf-8", "replace"),
                sequence_start=bool(rng.random() < 0.3),
                sequence_end=bool(rng.random() < 0.3),
                key=send.key,
            )
            out.append(_send(body))
        else:
            out.append(_fuzz_one(rng, send, donors, keys, value_p=0.3, header_p=0.15, key_p=0.05))
    out = out[:n]
    _resize(rng, out, AUDIO_LIMIT, 3)
    return out


# --------------------------------------------------------------------------- running topologies


@dataclass
class Running:
    name: str
    topo: tp.TopologyFiles
    proc: tp.PipelineProcess
    rss_before: int = 0
    is_primary: Callable[[Rec], bool] = lambda _r: True
    expectations: dict[int, Expect] = field(default_factory=dict)
    """Every logical record sent to this topology, by seq."""
    produced: int = 0
    observed: dict[int, tuple[int, int]] = field(default_factory=dict)
    """(results, dead letters) of each logical record when its phase ended."""

    def remember(self, out: Outcomes, seqs: Sequence[int]) -> None:
        for seq in seqs:
            self.observed[seq] = (len(out.results.get(seq, ())), len(out.dead.get(seq, ())))

    def topic(self, suffix: str) -> str:
        return self.topo.input_topic if not suffix else f"{self.topo.name}.{suffix}"

    def dropped(self) -> Counter[tuple[str, str]]:
        """``pipeline_records_dropped_total`` per (stage, reason), from the worker's /metrics."""
        status, text = self.proc.get("/metrics")
        assert status == 200, f"{self.name}: /metrics answered {status}"
        counts: Counter[tuple[str, str]] = Counter()
        for line in text.splitlines():
            if line.startswith("pipeline_records_dropped_total{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line[line.index("{") : line.index("}")]))
                counts[(labels.get("stage", ""), labels.get("reason", ""))] += int(float(line.rsplit(" ", 1)[1]))
        return counts


@dataclass
class Campaign:
    bootstrap: str
    s3: S3Settings
    workers: dict[str, Running]
    ensemble_items: list[Item] = field(default_factory=list)
    ensemble_drops_before: Counter[tuple[str, str]] = field(default_factory=Counter)
    ensemble_sent_at: float = 0.0

    def check_alive(self) -> None:
        for run in self.workers.values():
            code = run.proc.proc.poll() if run.proc.proc is not None else None
            assert code is None, f"the {run.name} worker exited with {code}:\n{run.proc.log()}"


def _audio_primary(record: Rec) -> bool:
    return header(record, "result-type") == "chunk"


@pytest.fixture(scope="module")
def campaign(
    kafka_bootstrap: str, cli_env: dict[str, str], s3_settings: S3Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Campaign]:
    tmp = tmp_path_factory.mktemp("hostile")
    dense = tp.write_topology(
        tmp,
        partitions=2,
        stage={"max_request_bytes": DENSE_LIMIT, "batching": {"max_queue_delay_ms": 5.0, "max_inflight_batches": 4}},
    )
    audio_stages = [
        {**AUDIO_STAGES[0], "max_request_bytes": AUDIO_LIMIT},
        {**SEQUENCE_STAGE, "gap_timeout_s": 1, "reorder_window": 16},
    ]
    audio = tp.write_topology(tmp, partitions=2, stages=audio_stages)
    ensemble = tp.write_ensemble_topology(tmp, window_ms=2000)
    procs = {
        name: tp.PipelineProcess(topo, cli_env, tmp / f"{name}.log")
        for name, topo in [("dense", dense), ("audio", audio), ("ensemble", ensemble)]
    }
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda p: p.start(ready_timeout=240), procs.values()))
        print(f"\nthree topology workers ready in {time.monotonic() - started:.1f}s")
        workers = {
            "dense": Running("dense", dense, procs["dense"]),
            "audio": Running("audio", audio, procs["audio"], is_primary=_audio_primary),
            "ensemble": Running("ensemble", ensemble, procs["ensemble"]),
        }
        for run in workers.values():
            run.rss_before = run.proc.rss_bytes()
        result = Campaign(kafka_bootstrap, s3_settings, workers)
        # The ensemble's records go first: its future-dated branch record needs about a minute
        # (event time is clamped to 60 s ahead) before its join window can close.
        items = [item for kind in kinds() if kind.topology == "ensemble" for item in kind.items]
        result.ensemble_drops_before = workers["ensemble"].dropped()
        _produce(result, workers["ensemble"], items)
        result.ensemble_items = items
        result.ensemble_sent_at = time.monotonic()
        yield result
    finally:
        for proc in procs.values():
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.kill()
                proc.proc.wait(timeout=10)


def _produce(campaign: Campaign, run: Running, items: Sequence[Item]) -> None:
    for item in items:
        item.seq = next(_SEQS)
        _SENT[item.seq] = item.sends
        run.expectations[item.seq] = item.expect
        run.produced += len(item.sends)
    asyncio.run(_produce_async(campaign.bootstrap, run, items))


async def _produce_async(bootstrap: str, run: Running, items: Sequence[Item]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_request_size=64 * MiB, request_timeout_ms=120_000
    )
    await producer.start()
    raw: dict[str, list[RawRecord]] = defaultdict(list)
    try:
        pending = []
        for item in items:
            for send in item.sends:
                headers = [*send.headers, (SEQ, str(item.seq).encode())]
                topic = run.topic(send.topic)
                if send.raw_header_key is not None:
                    raw[topic].append(RawRecord(send.key, send.value, [*headers, (RawKey(send.raw_header_key), b"x")]))
                    continue
                pending.append(
                    await producer.send(
                        topic, send.value, key=send.key, headers=headers, timestamp_ms=send.timestamp_ms
                    )
                )
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    for topic, records in raw.items():
        for start in range(0, len(records), 16):
            await produce_raw_batch(bootstrap, TopicPartition(topic, 0), build_batch(records[start : start + 16]))


# --------------------------------------------------------------------------- reading outcomes


@dataclass
class Outcomes:
    results: dict[int, list[Rec]] = field(default_factory=lambda: defaultdict(list))
    extra: dict[int, list[Rec]] = field(default_factory=lambda: defaultdict(list))
    """Results that are not a record's own outcome: gap, segment and summary results."""
    dead: dict[int, list[Rec]] = field(default_factory=lambda: defaultdict(list))
    orphans: list[Rec] = field(default_factory=list)
    """Outputs that answer no record the campaign sent."""
    total: int = 0

    def count(self, seq: int) -> int:
        return len(self.results.get(seq, ())) + len(self.dead.get(seq, ()))


def _seq_of(record: Rec, store: ClaimCheckStore, manifests: dict[str, int | None]) -> int | None:
    text = header(record, SEQ)
    if text is not None:
        return int(text)
    check = read_claim_check(record.headers)
    if check is None or check.uri is None:
        return None
    uri = check.uri.removesuffix("/value") + "/record.json"
    if uri not in manifests:
        manifest = json.loads(store.get(uri))
        found = [base64.b64decode(v) for k, v in manifest["headers"] if k == SEQ and v is not None]
        manifests[uri] = int(found[-1]) if found else None
    return manifests[uri]


def read_outcomes(
    campaign: Campaign,
    run: Running,
    *,
    done: Callable[[Outcomes], bool] | None = None,
    timeout: float,
) -> Outcomes:
    """Read the topology's result and dead-letter topics from the start until ``done``, then
    ``GRACE_S`` more (``done`` None: until their end offsets of now); the workers are polled
    all along."""
    return asyncio.run(_read_outcomes(campaign, run, done, timeout))


async def _read_outcomes(
    campaign: Campaign, run: Running, done: Callable[[Outcomes], bool] | None, timeout: float
) -> Outcomes:
    consumer = AIOKafkaConsumer(
        run.topo.result_topic,
        run.topo.dead_letter_topic,
        bootstrap_servers=campaign.bootstrap,
        auto_offset_reset="earliest",
        group_id=None,
        enable_auto_commit=False,
        max_partition_fetch_bytes=64 * MiB,
        fetch_max_bytes=64 * MiB,
    )
    store = ClaimCheckStore(campaign.s3)
    manifests: dict[str, int | None] = {}
    out = Outcomes()
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        grace_until: float | None = None
        ends: dict[TopicPartition, int] = {}
        if done is None:
            topics = [run.topo.result_topic, run.topo.dead_letter_topic]
            parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
            assert parts, f"{run.name}: no partitions of {topics}"
            ends = await consumer.end_offsets(parts)
        while time.monotonic() < deadline and (grace_until is None or time.monotonic() < grace_until):
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                for record in records:
                    out.total += 1
                    text = header(record, SEQ)
                    seq = int(text) if text is not None else await asyncio.to_thread(_seq_of, record, store, manifests)
                    if seq is None or seq not in run.expectations:
                        out.orphans.append(record)
                    elif record.topic == run.topo.dead_letter_topic:
                        out.dead[seq].append(record)
                    elif run.is_primary(record):
                        out.results[seq].append(record)
                    else:
                        out.extra[seq].append(record)
            campaign.check_alive()
            if done is None:
                if all([await consumer.position(tp) >= end for tp, end in ends.items()]):
                    break
            elif grace_until is None and done(out):
                grace_until = time.monotonic() + GRACE_S
    finally:
        await consumer.stop()
    return out


def _observed(out: Outcomes, seq: int) -> str:
    parts = []
    results = out.results.get(seq, [])
    if results:
        parts.append("result" if len(results) == 1 else f"{len(results)} results")
    letters = [read_dead_letter(r.headers) for r in out.dead.get(seq, [])]
    for (cls, stage), n in Counter((d.error_class, d.stage) for d in letters).items():
        parts.append(("" if n == 1 else f"{n}× ") + f"dead letter {cls} @{stage}")
    return " + ".join(parts) or "no output"


def _problem(expect: Expect, out: Outcomes, seq: int) -> str | None:
    """Why the outputs of ``seq`` break its expectation (None: they keep it). Drops are
    accounted for globally, against the metric."""
    results = out.results.get(seq, [])
    letters = [read_dead_letter(r.headers) for r in out.dead.get(seq, [])]
    if expect.any_one or expect.fuzz_drop_ok:
        n = len(results) + len(letters)
        return None if n == 1 or (n == 0 and expect.fuzz_drop_ok) else f"{n} outcomes"
    if len(results) != expect.results:
        return f"{len(results)} results, expected {expect.results}"
    low, high = expect.dead_count
    if not low <= len(letters) <= high:
        return f"{len(letters)} dead letters, expected {low}-{high}"
    wrong = [
        f"{d.error_class}@{d.stage}"
        for d in letters
        if d.error_class not in expect.dead or (expect.stage and d.stage != expect.stage)
    ]
    if wrong:
        return f"dead letter {', '.join(wrong)}, expected {'|'.join(expect.dead)}@{expect.stage}"
    return None


def _expected_drops(items: Sequence[Item]) -> Counter[tuple[str, str]]:
    drops: Counter[tuple[str, str]] = Counter()
    for item in items:
        if item.expect.drops:
            drops[(item.expect.stage or "", item.expect.drop_reason)] += item.expect.drops
    return drops


def _hostile_done(
    items: Sequence[Item], run: Running, drops_before: Counter[tuple[str, str]]
) -> Callable[[Outcomes], bool]:
    needed = {i.seq: (1 if i.expect.any_one else i.expect.results + i.expect.dead_count[0]) for i in items}
    want_drops = _expected_drops(items)

    def done(out: Outcomes) -> bool:
        if any(out.count(seq) < n for seq, n in needed.items()):
            return False
        return run.dropped() - drops_before >= want_drops

    return done


def run_hostile(
    campaign: Campaign,
    topology: str,
    *,
    timeout: float,
    items: Sequence[Item] | None = None,
    drops_before: Counter[tuple[str, str]] | None = None,
) -> None:
    run = campaign.workers[topology]
    mine = [k for k in kinds() if k.topology == topology]
    if items is None:
        items = [item for kind in mine for item in kind.items]
        drops_before = run.dropped()
        _produce(campaign, run, items)
    assert drops_before is not None
    started = time.monotonic()
    out = read_outcomes(campaign, run, done=_hostile_done(items, run, drops_before), timeout=timeout)
    drops = run.dropped() - drops_before
    print(
        f"\n{topology}: {len(mine)} hostile kinds, {sum(len(i.sends) for i in items)} records, outcomes read in {time.monotonic() - started:.1f}s"
    )
    print(f"{'kind':<62} {'expected':<58} observed")
    failures = []
    for kind in mine:
        for item in kind.items:
            problem = _problem(item.expect, out, item.seq)
            if item.probe or problem:
                mark = "  " if problem is None else "✗ "
                label = kind.name if item.probe else f"{kind.name} (context record)"
                print(f"{mark}{label:<60} {item.expect.describe():<58} {_observed(out, item.seq)}")
            if problem:
                failures.append(
                    f"{topology} / {kind.name} (seq {item.seq}): {problem}; observed {_observed(out, item.seq)}"
                )
    run.remember(out, [i.seq for i in items])
    want = _expected_drops(items)
    print(f"drops: expected {dict(want)}, counted {dict(drops)}")
    assert not out.orphans, [(r.topic, r.key, r.headers[:6]) for r in out.orphans[:5]]
    assert not failures, "\n".join(failures) + f"\n{campaign.workers[topology].proc.log()[-3000:]}"
    assert drops == want, f"drops counted {dict(drops)} != expected {dict(want)}"
    _check_result_values(mine, out)


def _check_result_values(selected: Sequence[Kind], out: Outcomes) -> None:
    """Spot checks that a result is the right answer and carries the request's headers byte for byte."""
    by_name = {(k.topology, k.name): k for k in selected}
    control = by_name.get(("dense", "valid protobuf request (control)"))
    if control is not None:
        (record,) = out.results[control.items[0].seq]
        response = decode_response(record.value, record.headers)
        np.testing.assert_allclose(response.outputs["logits"], mlp_reference(FEATURES[:1]), rtol=1e-4, atol=1e-5)
    latin = by_name.get(("dense", "header value not UTF-8 (application header)"))
    if latin is not None:
        (record,) = out.results[latin.items[0].seq]
        assert ("x-app", b"\xff\xfe\x80") in list(record.headers)
    null = by_name.get(("dense", "null header value (application header)"))
    if null is not None:
        (record,) = out.results[null.items[0].seq]
        assert ("x-null", None) in list(record.headers)
    many = by_name.get(("dense", "10,000 headers"))
    if many is not None:
        (record,) = out.results[many.items[0].seq]
        assert sum(1 for k, _ in record.headers if k.startswith("x-h")) == 10_000
    ensemble = by_name.get(("ensemble", "valid request (control)"))
    if ensemble is not None:
        (record,) = out.results[ensemble.items[0].seq]
        response = decode_response(record.value, record.headers)
        features = norm_reference(random_features(1, 1))
        np.testing.assert_allclose(response.outputs["logits"], mlp_reference(features), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(response.outputs["score"], score_reference(features), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- the tests


def test_docs_table_lists_every_hostile_kind() -> None:
    """At least 40 distinct kinds, and docs/message-contract.md carries exactly this table."""
    names = {k.name for k in kinds()}
    assert len(names) >= 40, len(names)
    assert len({(k.topology, k.name) for k in kinds()}) == len(kinds()), "kind names repeat within a topology"
    docs = (Path(__file__).resolve().parents[2] / "docs" / "message-contract.md").read_text()
    assert "## Hostile input campaign" in docs
    section = docs.split("## Hostile input campaign", 1)[1]
    assert markdown_table(kinds()) in section, "regenerate the table: print(markdown_table(kinds()))"


def test_hostile_kinds_through_the_dense_topology(campaign: Campaign) -> None:
    run_hostile(campaign, "dense", timeout=60)


def test_hostile_kinds_through_the_audio_topology(campaign: Campaign) -> None:
    run_hostile(campaign, "audio", timeout=40)


def test_ten_thousand_fuzzed_records(campaign: Campaign) -> None:
    print(f"\nfuzz seed {FUZZ_SEED} (numpy default_rng): {FUZZ_DENSE} dense records, {FUZZ_AUDIO} audio records")
    rng = np.random.default_rng(FUZZ_SEED)
    plans = [("dense", fuzz_dense(rng, FUZZ_DENSE)), ("audio", fuzz_audio(rng, FUZZ_AUDIO))]
    assert sum(len(sends) for _, sends in plans) == 10_000
    started = time.monotonic()
    phases = []
    for name, sends in plans:
        run = campaign.workers[name]
        before = run.dropped()
        items = [Item([send], Expect(any_one=name == "dense", fuzz_drop_ok=name == "audio")) for send in sends]
        _produce(campaign, run, items)
        phases.append((run, items, before))
    print(f"10,000 fuzzed records produced in {time.monotonic() - started:.1f}s")
    for run, items, before in phases:
        seqs = [i.seq for i in items]

        def done(
            out: Outcomes, seqs: list[int] = seqs, run: Running = run, before: Counter[tuple[str, str]] = before
        ) -> bool:
            answered = sum(1 for s in seqs if out.count(s))
            return answered + sum((run.dropped() - before).values()) >= len(seqs)

        out = read_outcomes(campaign, run, done=done, timeout=180)
        drops = run.dropped() - before
        silent = [s for s in seqs if out.count(s) == 0]
        problems = [(s, _problem(i.expect, out, s)) for s, i in zip(seqs, items, strict=True)]
        problems = [(s, p) for s, p in problems if p]
        classes = Counter(read_dead_letter(r.headers).error_class for s in seqs for r in out.dead.get(s, []))
        results = sum(len(out.results.get(s, [])) for s in seqs)
        print(
            f"{run.name}: {len(seqs)} records -> {results} results, {sum(classes.values())} dead letters, "
            f"{len(silent)} without output, drops counted {dict(drops)}; dead letters by class {dict(classes.most_common())}"
        )
        run.remember(out, seqs)
        _print_internal_failures(out, seqs)
        assert not out.orphans, [(r.topic, r.key, list(r.headers)[:6]) for r in out.orphans[:5]]
        assert not problems, f"{len(problems)} records with a wrong number of outcomes, e.g. {problems[:10]}"
        assert len(silent) == sum(drops.values()), f"{len(silent)} records without output, {dict(drops)} counted drops"
    print(f"fuzz campaign done in {time.monotonic() - started:.1f}s")


def _print_internal_failures(out: Outcomes, seqs: Sequence[int]) -> None:
    """Dead letters of class inference-failed: their reasons, and for a sequence stage's the
    time since the stream's previous output (Triton forgets a sequence idle for 10 s)."""
    failed = [
        r for s in seqs for r in out.dead.get(s, []) if read_dead_letter(r.headers).error_class == "inference-failed"
    ]
    if not failed:
        return
    reasons = Counter(re.sub(r"\d+", "N", read_dead_letter(r.headers).reason)[:110] for r in failed)
    print(f"  inference-failed dead letters: {len(failed)}; reasons: {dict(reasons.most_common(4))}")
    by_key: dict[bytes | None, list[int]] = defaultdict(list)
    for bucket in (out.results, out.extra, out.dead):
        for s in seqs:
            for record in bucket.get(s, []):
                by_key[record.key].append(record.timestamp)
    gaps = []
    for record in failed:
        earlier = [t for t in by_key[record.key] if t < record.timestamp]
        if earlier:
            gaps.append((record.timestamp - max(earlier)) / 1000)
    if gaps:
        print(
            f"  seconds since the stream's previous output: min {min(gaps):.1f}, median {float(np.median(gaps)):.1f}, "
            f"max {max(gaps):.1f} ({sum(g > 10 for g in gaps)} of {len(gaps)} over 10 s)"
        )
    for record in failed[:3]:
        history = sorted(
            (
                r.timestamp,
                r.topic.rsplit(".", 1)[-1],
                header(r, "result-type") or read_dead_letter(r.headers).error_class,
                header(r, SEQ),
            )
            for bucket in (out.results, out.extra, out.dead)
            for s in seqs
            for r in bucket.get(s, [])
            if r.key == record.key
        )
        start = history[0][0] if history else 0
        print(
            f"  e.g. stream {record.key[:40]!r}: "
            + ", ".join(f"{(t - start) / 1000:.1f}s {kind} ({_chunk_label(q)})" for t, _topic, kind, q in history[:14])
        )


def _chunk_label(seq: str | None) -> str:
    """``#index`` of the chunk a seq was sent as, with its flags (``s`` start, ``e`` end)."""
    sends = _SENT.get(int(seq)) if seq is not None else None
    if not sends:
        return "?"
    try:
        request = decode_request(sends[0].value, sends[0].headers)
    except BadRequest:
        return "bad"
    flags = ("s" if request.sequence_start else "") + ("e" if request.sequence_end else "")
    return f"#{request.parameters.get('chunk_index')}{flags}"


def test_hostile_kinds_through_the_ensemble_topology(campaign: Campaign) -> None:
    """Produced when the module started (see the fixture); read now."""
    waited = time.monotonic() - campaign.ensemble_sent_at
    run_hostile(
        campaign,
        "ensemble",
        timeout=max(30.0, 150 - waited),
        items=campaign.ensemble_items,
        drops_before=campaign.ensemble_drops_before,
    )


def test_workers_stayed_up_every_output_answers_one_record_and_memory_is_bounded(campaign: Campaign) -> None:
    """The whole run read again, per topology: no output answers a record that was not sent, no
    record got an outcome after its phase ended (a late duplicate); RSS within the bound; every
    worker still up, and exit code 0 at SIGTERM."""
    campaign.check_alive()
    rss = {name: run.proc.rss_bytes() for name, run in campaign.workers.items()}
    problems = []
    for name, run in campaign.workers.items():
        out = read_outcomes(campaign, run, timeout=60)
        growth = rss[name] - run.rss_before
        print(
            f"{name}: {run.produced} records produced, {out.total} outputs; worker RSS {run.rss_before / MiB:.0f} MiB -> "
            f"{rss[name] / MiB:.0f} MiB ({growth / MiB:+.0f} MiB, bound +{RSS_BOUND / MiB:.0f} MiB)"
        )
        if out.orphans:
            problems.append(f"{name}: {len(out.orphans)} outputs answer no record sent")
        late = [
            seq
            for seq, seen in run.observed.items()
            if (len(out.results.get(seq, ())), len(out.dead.get(seq, ()))) != seen
        ]
        if late:
            problems.append(f"{name}: records with outcomes after their phase ended: {late[:10]}")
        if growth > RSS_BOUND:
            problems.append(f"{name}: RSS grew by {growth / MiB:.0f} MiB")
    assert not problems, problems
    for name, run in campaign.workers.items():
        code = run.proc.terminate(timeout=60)
        assert code == 0, f"{name}: exit code {code} at SIGTERM\n{run.proc.log()}"


def test_unreadable_records_among_large_records(tansu_bootstrap: str, tansu_env: dict[str, str], tmp_path: Path) -> None:
    """Records with a non-UTF-8 header key among 2 MiB requests, all in one partition and
    produced before the worker starts (its first fetch, up to max_record_bytes = 17 MiB here,
    holds them all): one alone behind 6 MiB of requests, one inside a 6 MiB record batch.
    The worker must dead-letter each bad record by position and answer every other one
    (tests/integration/test_unreadable_records.py covers small records only)."""
    topo = tp.write_topology(tmp_path, partitions=1)  # dense_classifier, max_request_bytes 16 MiB
    kafka = KafkaSettings(bootstrap_servers=tansu_bootstrap)
    asyncio.run(ensure_topics(kafka, [topo.input_topic], partitions=1))

    def request(seq: int, pad: int = 0) -> RawRecord:
        send = _js(f"large-{seq}")
        return RawRecord(send.key, (send.value or b"") + b" " * pad, [*send.headers, (SEQ, str(seq).encode())])

    def unreadable(seq: int) -> RawRecord:
        record = request(seq)
        return RawRecord(record.key, record.value, [*record.headers, (RawKey(b"\xff\xfe"), b"x")])

    batches = [
        [request(0, 2 * MiB)],
        [request(1, 2 * MiB)],
        [request(2, 2 * MiB)],
        [unreadable(3)],
        [request(4)],
        [request(5, 2 * MiB), request(6, 2 * MiB), unreadable(7), request(8, 2 * MiB)],
        [request(9)],
    ]

    async def produce_all() -> None:
        for records in batches:
            await produce_raw_batch(tansu_bootstrap, TopicPartition(topo.input_topic, 0), build_batch(records))

    asyncio.run(produce_all())
    with tp.pipeline_process(topo, tansu_env, tmp_path) as worker:
        out = tp.collect_outputs(tansu_bootstrap, topo, lambda rs: len(rs) >= 10, timeout=60)
        alive = worker.proc is not None and worker.proc.poll() is None
        log = worker.log()
        code = worker.terminate(timeout=60) if alive else worker.proc.returncode if worker.proc else None
    seen = {header(r, SEQ): (r.topic.rsplit(".", 1)[-1], read_dead_letter(r.headers).error_class) for r in out.records}
    print(f"outputs by x-test-seq: {seen}; worker alive after: {alive}")
    assert alive, f"the worker exited:\n{log}"
    assert code == 0
    want = {str(i): ("results", "") for i in (0, 1, 2, 4, 5, 6, 8, 9)}
    want |= {"3": ("dead-letters", "unreadable-record"), "7": ("dead-letters", "unreadable-record")}
    assert seen == want, seen
