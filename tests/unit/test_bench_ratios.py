"""The stateless benchmark's printed targets come from the right cases (benchmarks/stateless.py).

A run's case (r) once overwrote case (c)'s throughput inside ``ratios`` (a comprehension's
assignment expression leaks into the function), and d / c printed 1,467.6 where the table
said 12,181 / 193 = 63.2. Each ratio is checked here against its cases.
"""

from __future__ import annotations

import pytest

from benchmarks.common import CaseResult
from benchmarks.stateless import CASES, TARGET_CPU_US, ratios


def _case(key: str, throughput: float, cpu_us: float | None = None) -> CaseResult:
    result = CaseResult(key, CASES[key], throughput=throughput)
    if cpu_us is not None:
        result.extra["throughput_rounds"] = [{"worker_cpu_us_per_request": cpu_us}]
    return result


def test_each_ratio_is_of_its_own_cases() -> None:
    results = {
        "a": _case("a", 35_000, 28),
        "c": _case("c", 193, 1_580),
        "d": _case("d", 12_180, 80),
        "g": _case("g", 11_380, 86),
        "r": _case("r", 108_500, 8),
    }
    got = ratios(results)
    assert got["d_over_c"] == pytest.approx(12_180 / 193)
    assert got["d_over_g"] == pytest.approx(12_180 / 11_380)
    assert got["a_cpu_over_d_cpu"] == pytest.approx(28 / 80)
    assert got["r_cpu_over_d_cpu"] == pytest.approx(8 / 80)
    assert got["echo_cpu_over_d_cpu"] == pytest.approx(8 / 80)
    assert got["d_cpu_met"] is (80 <= TARGET_CPU_US)


def test_without_the_echoes_there_is_no_echo_ratio() -> None:
    got = ratios({"d": _case("d", 12_000, 70), "c": _case("c", 200)})
    assert "echo_cpu_over_d_cpu" not in got and got["d_cpu_us_per_request"] == 70
    assert got["d_over_c"] == pytest.approx(60)


def test_exactly_once_is_priced_against_at_least_once_in_the_same_run() -> None:
    got = ratios({"d": _case("d", 12_000, 70), "x": _case("x", 8_000, 105)})
    assert got["d_over_x"] == pytest.approx(12_000 / 8_000)  # throughput at-least-once gains
    assert got["x_cpu_over_d_cpu"] == pytest.approx(105 / 70)  # CPU per request exactly-once costs
