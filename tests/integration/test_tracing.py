"""OpenTelemetry tracing end to end: the ensemble topology exporting over OTLP/gRPC to a real endpoint.

Each request is produced with its own ``traceparent``; every span of its journey
(normalise, both branches, the join, Triton calls and produces) must land in that one trace, with the right parents, and the result
must carry the join span's context.

And Triton itself: a tritonserver of this module's own, started with its OpenTelemetry
tracing on (``--trace-config mode=opentelemetry``, exporting OTLP/HTTP to a second real
endpoint), must continue the context our Triton call span sends in the gRPC metadata:
its ``InferRequest`` spans are children of our call spans, in the same traces.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipeline.contract.records import Record
from pipeline.contract.request import encode_request
from pipeline.embedded.stack import EmbeddedStack
from pipeline.settings import S3Settings
from tests.helpers.dense_reference import random_features
from tests.helpers.kafka_io import header, produce
from tests.helpers.otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_http_receiver, otlp_receiver
from tests.helpers.topology_process import (
    collect_outputs,
    pipeline_process,
    write_ensemble_topology,
    write_topology,
)

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.s3, pytest.mark.slow]

DENSE_TOPOLOGY = Path(__file__).resolve().parents[2] / "topologies" / "dense.yaml"

STAGES = ("normalise", "classify", "score")
JOIN = "join-result"
N = 4


def _requests() -> list[tuple[Record, str, str]]:
    """(record, trace id, the caller's span id) per request."""
    raw = random_features(N, 5)
    out = []
    for i in range(N):
        trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
        record = encode_request(
            {"raw": raw[i : i + 1]}, correlation_id=f"tr-{i}", traceparent=f"00-{trace_id}-{parent}-01"
        )
        out.append((record, trace_id, parent))
    return out


def _complete(spans: list[ReceivedSpan], trace_ids: set[str]) -> bool:
    """Every request's trace has its five record spans and the join's produce to the result."""
    for trace_id in trace_ids:
        mine = [s for s in spans if s.trace_id == trace_id]
        if sum(s.kind == "consumer" for s in mine) < 5 or sum(s.kind == "producer" for s in mine) < 5:
            return False
    return True


def _check_trace(spans: list[ReceivedSpan], trace_id: str, caller: str, result_traceparent: str, topology: str) -> None:
    mine = [s for s in spans if s.trace_id == trace_id]
    by_id = {s.span_id: s for s in mine}
    records = {}
    joins = []
    for span in mine:
        if span.kind == "consumer":
            assert span.attributes["messaging.system"] == "kafka"
            assert span.service == f"pipeline.{topology}"
            stage = span.attributes["pipeline.stage"]
            if stage == JOIN:
                joins.append(span)
            else:
                assert stage not in records, f"two {stage} spans in one trace"
                records[stage] = span
    assert set(records) == set(STAGES) and len(joins) == 2, sorted(s.name for s in mine)
    # The request's span -> normalise -> both branches -> one join span per branch.
    assert records["normalise"].parent_id == caller
    assert records["classify"].parent_id == records["normalise"].span_id
    assert records["score"].parent_id == records["normalise"].span_id
    assert {j.parent_id for j in joins} == {records["classify"].span_id, records["score"].span_id}
    # Per stateless stage: the wait in the batch is an event, the produce a child; the
    # Triton call (kind CLIENT, RPC attributes) is linked to the record span.
    for stage, record in records.items():
        assert "batch sent" in record.events, stage
        children = [s for s in mine if s.parent_id == record.span_id]
        assert any(s.kind == "producer" for s in children), stage
        calls = [s for s in spans if s.kind == "client" and (trace_id, record.span_id) in s.links]
        assert calls, f"{stage}: no Triton call span linked to its record span"
        assert all(c.attributes["rpc.system"] == "grpc" and c.attributes["rpc.method"] == "ModelInfer" for c in calls)
        assert all(c.attributes["pipeline.batch.rows"] >= 1 for c in calls)  # type: ignore[operator]
    # The result carries the span of the join record that completed the join, which links
    # the other branch's span; its produce to the result topic is that span's child.
    _, result_trace, result_span, _ = result_traceparent.split("-")
    assert result_trace == trace_id
    completing = by_id[result_span]
    assert completing in joins
    other = ({records["classify"].span_id, records["score"].span_id} - {completing.parent_id}).pop()
    assert (trace_id, other) in completing.links
    assert any(s.kind == "producer" and s.parent_id == completing.span_id for s in mine)
    # Nothing of this request's journey fell out of its trace.
    cid = next(iter(records.values())).attributes["messaging.message.conversation_id"]
    assert all(s.trace_id == trace_id for s in spans if s.attributes.get("messaging.message.conversation_id") == cid)


def test_one_request_is_one_trace_through_every_stage_and_the_join(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = write_ensemble_topology(tmp_path)
    requests = _requests()
    with otlp_receiver() as receiver:
        env = dict(cli_env, **receiver.environment())
        env.pop("OTEL_SERVICE_NAME", None)
        with pipeline_process(topo, env, tmp_path) as worker:
            asyncio.run(produce(kafka_bootstrap, topo.input_topic, [r for r, _, _ in requests]))
            out = collect_outputs(kafka_bootstrap, topo, lambda rs: len(rs) >= N, timeout=120)
            spans = receiver.wait_for(lambda s: _complete(s, {t for _, t, _ in requests}), timeout=60)
            assert worker.terminate() == 0
    assert out.on(topo.dead_letter_topic) == []
    results = {header(r, "correlation-id"): header(r, "traceparent") for r in out.on(topo.result_topic)}
    assert len(results) == N
    for i, (_, trace_id, caller) in enumerate(requests):
        traceparent = results[f"tr-{i}"]
        assert traceparent is not None
        _check_trace(spans, trace_id, caller, traceparent, topo.name)


@pytest.fixture(scope="module")
def traced_triton(s3_settings: S3Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, OtlpReceiver]]:
    """A Triton of this module's own tracing every request over OpenTelemetry; its gRPC URL and
    the OTLP/HTTP endpoint receiving its spans."""
    with otlp_http_receiver() as received:
        args = [
            "--trace-config=mode=opentelemetry",
            f"--trace-config=opentelemetry,url={received.endpoint}/v1/traces",
            "--trace-config=opentelemetry,bsp_schedule_delay=200",
            "--trace-config=rate=1",
            "--trace-config=level=TIMESTAMPS",
        ]
        stack = EmbeddedStack(
            services=("triton",), s3=s3_settings, log_dir=tmp_path_factory.mktemp("traced-triton"), triton_args=args
        )
        stack.start()
        try:
            assert stack.endpoints.triton.grpc_url
            yield stack.endpoints.triton.grpc_url, received
        finally:
            stack.stop()


def test_triton_continues_the_trace_of_each_call(
    kafka_bootstrap: str, cli_env: dict[str, str], traced_triton: tuple[str, OtlpReceiver], tmp_path: Path
) -> None:
    triton_url, from_triton = traced_triton
    dense = yaml.safe_load(DENSE_TOPOLOGY.read_text())
    topo = write_topology(tmp_path, partitions=dense["kafka"]["partitions"], stages=dense["stages"])
    features = random_features(N, 7)
    records = [
        encode_request(
            {"features": features[i : i + 1]},
            correlation_id=f"tt-{i}",
            traceparent=f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01",
        )
        for i in range(N)
    ]
    with otlp_receiver() as ours:
        env = dict(cli_env, **ours.environment(), PIPELINE_TRITON_GRPC_URL=triton_url)
        with pipeline_process(topo, env, tmp_path) as worker:
            asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
            out = collect_outputs(kafka_bootstrap, topo, lambda rs: len(rs) >= N, timeout=120)
            assert worker.terminate() == 0, worker.log()
        calls = [s for s in ours.spans if s.kind == "client"]
    assert len(out.on(topo.result_topic)) == N and out.on(topo.dead_letter_topic) == []
    assert calls, "no Triton call span exported"

    def continued(spans: list[ReceivedSpan]) -> bool:
        parents = {(s.trace_id, s.parent_id) for s in spans if s.name == "InferRequest"}
        return all((c.trace_id, c.span_id) in parents for c in calls)

    try:
        spans = from_triton.wait_for(continued, timeout=60)
    except AssertionError as exc:  # once on CI (2026-11-28) Triton's spans of one call of two came: say more
        ours_listed = [(c.span_id, c.events, sorted(c.attributes.items())) for c in calls]
        raise AssertionError(f"{exc}; our call spans: {ours_listed}") from None
    # Every InferRequest Triton traced is the child of one of our call spans: the whole
    # journey, Triton's queue and compute included, is one trace per request.
    ours_by_id = {(c.trace_id, c.span_id) for c in calls}
    infers = [s for s in spans if s.name == "InferRequest"]
    assert {(s.trace_id, s.parent_id) for s in infers} <= ours_by_id, infers
    assert any(s.name == "compute" for s in spans), sorted({s.name for s in spans})
