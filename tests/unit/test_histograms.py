"""observe_many against one observe per value: the same exposition (pipeline/observability/histograms.py)."""

from __future__ import annotations

import math
import random

from prometheus_client import CollectorRegistry, Histogram

from pipeline.observability.histograms import observe_many


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, Histogram]:
    buckets = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
    one, many = CollectorRegistry(), CollectorRegistry()
    return (
        one,
        Histogram("latency_seconds", "x", ["stage"], buckets=buckets, registry=one),
        many,
        Histogram("latency_seconds", "x", ["stage"], buckets=buckets, registry=many),
    )


def test_observe_many_exposes_what_one_observe_per_value_does() -> None:
    rng = random.Random(7)
    one_registry, one, many_registry, many = _pair()
    batches = [
        [
            rng.choice([0.0, 0.005, 0.01, 1.0, 5.0, 7.5]) if rng.random() < 0.3 else rng.expovariate(4)
            for _ in range(rng.randrange(0, 40))
        ]
        for _ in range(50)
    ]
    batches.append([math.nan, 0.2])  # NaN: in the sum, in no bucket, as observe does
    for batch in batches:
        for value in batch:
            one.labels("s").observe(value)
        observe_many(many.labels("s"), batch)
    exposed = [_samples(registry) for registry in (one_registry, many_registry)]
    assert exposed[0].keys() == exposed[1].keys()
    for name, value in exposed[0].items():
        if name[0].endswith("_sum"):  # added in another order: equal up to rounding (NaN here)
            assert math.isnan(value) and math.isnan(exposed[1][name]), name
        else:
            assert value == exposed[1][name], name


def test_observe_many_sums_like_observe() -> None:
    one_registry, one, many_registry, many = _pair()
    values = [0.001 * i for i in range(100)]
    for value in values:
        one.labels("s").observe(value)
    observe_many(many.labels("s"), values)
    sums = [_samples(r)[("latency_seconds_sum", (("stage", "s"),))] for r in (one_registry, many_registry)]
    assert math.isclose(sums[0], sums[1], rel_tol=1e-12)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample but the creation time, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }
