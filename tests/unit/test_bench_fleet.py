"""The Triton fleet benchmark's cost model (benchmarks/fleet.py): what N replicas on N hosts give.

Pure arithmetic on CPU per request, so a wrong printed table would come from here: each
figure is checked against the sum done by hand.
"""

from __future__ import annotations

import pytest

from benchmarks.fleet import cost_model, stage_binds_from


def test_one_worker_against_fast_replicas_binds_on_the_stage_from_the_first() -> None:
    # 100 µs per request in the worker: 10,000/s; a 2-core replica at 50 µs: 40,000/s.
    rows = cost_model(stage_us=100, triton_us=50, host_cores=2, workers=1)
    assert [r.replicas for r in rows] == [1, 2, 4, 8]
    assert [r.stage_rps for r in rows] == pytest.approx([10_000] * 4)
    assert [r.triton_rps for r in rows] == pytest.approx([40_000, 80_000, 160_000, 320_000])
    assert [r.throughput for r in rows] == pytest.approx([10_000] * 4)
    assert {r.binds for r in rows} == {"stage"}
    assert [r.workers_to_fill for r in rows] == [4, 8, 16, 32]
    assert stage_binds_from(100, 50, 2, 1) == 1


def test_many_workers_bind_on_triton_until_enough_replicas() -> None:
    # 8 workers at 100 µs: 80,000/s; one 4-core replica at 200 µs: 20,000/s, so N = 4 matches them.
    rows = cost_model(stage_us=100, triton_us=200, host_cores=4, workers=8)
    assert [r.throughput for r in rows] == pytest.approx([20_000, 40_000, 80_000, 80_000])
    assert [r.binds for r in rows] == ["Triton", "Triton", "stage", "stage"]
    assert stage_binds_from(100, 200, 4, 8) == 4
    assert stage_binds_from(100, 200, 4, 9) == 5  # 90,000/s: four replicas are 10,000/s short


def test_host_cores_scale_one_replica() -> None:
    one, eight = (cost_model(50, 400, cores, 1, replicas=(1,))[0] for cores in (1, 8))
    assert eight.triton_rps == pytest.approx(8 * one.triton_rps) == pytest.approx(20_000)


@pytest.mark.parametrize(
    ("stage_us", "triton_us", "cores", "workers"), [(0, 10, 2, 1), (10, -1, 2, 1), (10, 10, 0, 1), (10, 10, 2, 0)]
)
def test_nonsense_inputs_are_refused(stage_us: float, triton_us: float, cores: int, workers: int) -> None:
    with pytest.raises(ValueError):
        cost_model(stage_us, triton_us, cores, workers)
