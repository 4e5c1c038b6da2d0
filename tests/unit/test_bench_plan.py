"""``pipeline bench``'s pure logic: sweep flags, percentiles and counts, the load generator's
loops (driven by an in-process caller: no Kafka or Triton is involved in that logic), and the
output shape check."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.tools.bench.load import run_step
from pipeline.tools.bench.plan import Mode, Step, make_plan, parse_levels
from pipeline.tools.bench.report import errors_text
from pipeline.tools.bench.stats import Outcome, StepStats
from pipeline.tools.bench.verify import OutputVerifier
from pipeline.triton.admin import ModelDescription, TensorSpec


def test_levels_parse_as_positive_numbers() -> None:
    assert parse_levels("1,4,16", "--concurrency", integer=True) == [1, 4, 16]
    assert parse_levels(" 500, 1000 ,2000.5", "--rate", integer=False) == [500, 1000, 2000.5]


@pytest.mark.parametrize(
    ("text", "integer", "fragment"),
    [
        ("1,,4", True, "empty value"),
        ("1,2.5", True, "'2.5' is not a whole number"),
        ("fast", False, "'fast' is not a number"),
        ("0,4", True, "'0' must be greater than 0"),
        ("-5", False, "'-5' must be greater than 0"),
        ("nan", False, "'nan' must be greater than 0"),
        ("inf", False, "'inf' must be greater than 0"),
    ],
)
def test_bad_levels_are_one_line_errors(text: str, integer: bool, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as raised:
        parse_levels(text, "--x", integer=integer)
    assert "\n" not in str(raised.value) and "--x" in str(raised.value)


def test_plan_defaults_to_a_concurrency_sweep_and_refuses_both() -> None:
    plan = make_plan(concurrency=None, rate=None, duration_s=5, warmup_s=1, timeout_s=10)
    assert [s.label for s in plan.steps] == ["c=1", "c=4", "c=16"]
    rates = make_plan(concurrency=None, rate="500,1000", duration_s=5, warmup_s=0, timeout_s=10)
    assert [s.label for s in rates.steps] == ["500/s", "1000/s"] and rates.steps[0].mode is Mode.RATE
    with pytest.raises(ConfigError, match="not both"):
        make_plan(concurrency="1", rate="10", duration_s=5, warmup_s=0, timeout_s=10)


def test_percentiles_are_nearest_rank_over_verified_results_only() -> None:
    stats = StepStats()
    stats.sent(100.0)
    for i in range(1, 101):
        stats.ended(Outcome.VERIFIED, 100.0 + i / 100, latency_ms=float(i))
    stats.ended(Outcome.DEAD_LETTER, 101.5, latency_ms=9999.0, error="dead letter from classify: x: y")
    stats.ended(Outcome.MISSING, 102.0, error="no answer")
    assert stats.percentiles() == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
    assert (stats.requests, stats.verified, stats.errors) == (102, 100, 2)
    assert stats.first_error == "dead letter from classify: x: y"
    assert stats.throughput == pytest.approx(100 / 2.0)
    assert errors_text(stats) == "2 (1 dead, 1 missing)"
    empty = StepStats()
    assert empty.percentiles()["p50"] is None and empty.throughput == 0.0 and errors_text(empty) == "0"


class _Service:
    """A caller that answers after ``delay_s``, counting how many calls overlap."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.inflight = 0
        self.most_inflight = 0

    async def call(self, stats: StepStats) -> None:
        sent = time.monotonic()
        stats.sent(sent)
        self.inflight += 1
        self.most_inflight = max(self.most_inflight, self.inflight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.inflight -= 1
        now = time.monotonic()
        stats.ended(Outcome.VERIFIED, now, latency_ms=(now - sent) * 1000)


async def test_closed_loop_keeps_exactly_the_concurrency_in_flight() -> None:
    service = _Service(0.01)
    stats = await run_step(service.call, Step(Mode.CONCURRENCY, 4), 0.5, asyncio.Event())
    assert stats is not None and service.most_inflight == 4
    assert 100 <= stats.verified <= 200  # 4 loops x 0.5 s / 10 ms each, less scheduling overhead
    assert stats.throughput == pytest.approx(stats.verified / stats.elapsed_s)


async def test_open_loop_holds_the_rate_whatever_the_answers_take() -> None:
    service = _Service(0.2)  # slower than the interval: calls overlap, the rate does not drop
    stats = await run_step(service.call, Step(Mode.RATE, 200), 1.0, asyncio.Event())
    assert stats is not None
    # A closed loop would send 5 per slot here; the schedule sends 200 (never more; fewer only
    # when this machine stalls the event loop past the pacer's 20 ms burst: loose lower bounds).
    assert 120 <= stats.requests <= 202
    assert service.most_inflight >= 20
    assert 120 <= stats.send_rate <= 205


async def test_open_loop_waits_when_outstanding_requests_reach_the_bound() -> None:
    service = _Service(0.2)
    stats = await run_step(service.call, Step(Mode.RATE, 1000), 0.5, asyncio.Event(), max_outstanding=5)
    assert stats is not None and service.most_inflight == 5
    assert stats.send_rate < 100  # 5 per 0.2 s at most: far below the 1000/s asked for


async def test_a_stop_cancels_the_step_and_returns_nothing() -> None:
    service = _Service(10.0)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, stop.set)
    started = time.monotonic()
    assert await run_step(service.call, Step(Mode.CONCURRENCY, 2), 30.0, stop) is None
    assert time.monotonic() - started < 2.0 and service.inflight == 0


def _dense(batching: bool = True) -> ModelDescription:
    spec = TensorSpec("logits", "FP32", [4], [-1, 4] if batching else [4])
    return ModelDescription(
        name="dense_classifier",
        versions=[1],
        platform="",
        backend="python",
        max_batch_size=64 if batching else 0,
        inputs=[TensorSpec("features", "FP32", [16], [-1, 16])],
        outputs=[spec],
    )


def test_verifier_checks_names_datatypes_and_shapes() -> None:
    verify = OutputVerifier(_dense())
    right = np.zeros((1, 4), np.float32)
    assert verify.problem({"logits": right}, {"logits": "FP32"}, rows=1) is None
    assert verify.problem({}, {}, rows=1) == "result has no outputs"
    assert "has shape [1, 3], expected [1, 4]" in str(verify.problem({"logits": right[:, :3]}, {}, rows=1))
    assert "has shape [1, 4], expected [2, 4]" in str(verify.problem({"logits": right}, {}, rows=2))
    assert "is FP64" in str(verify.problem({"logits": right}, {"logits": "FP64"}, rows=1))
    # Renamed outputs (an ensemble's output_map): only one row out per row in can be checked.
    assert verify.problem({"scores": right}, {}, rows=1) is None
    assert "for 2 row(s) sent" in str(verify.problem({"scores": right}, {}, rows=2))
    assert OutputVerifier(_dense(batching=False)).problem({"logits": np.zeros(4, np.float32)}, {}, rows=1) is None
