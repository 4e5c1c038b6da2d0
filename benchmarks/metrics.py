"""Reading Prometheus ``/metrics`` during a benchmark: a worker's stage metrics, Triton's counters.

Why: the benchmarks explain their numbers with what the measured processes
report themselves (the stage's batch sizes, queue delay and Triton call time;
Triton's per-model request, queue and compute times), each sampled around a
phase and compared. Finding a worker's endpoint (the line ``pipeline run``
logs) and reading a scrape into ``(sample, label) -> value`` is the same for
all of them, so it lives here once.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import WorkerProcess

Values = dict[tuple[str, str], float]

_URL_IN_LOG = re.compile(r"metrics on (http://\S+/metrics)")


def worker_metrics_urls(process: WorkerProcess) -> list[str]:
    """Every health/metrics URL a ``pipeline run`` worker logged, latest first, each once
    (``--processes N``: one per child; a restarted child's again)."""
    found = _URL_IN_LOG.findall(process.log_path.read_text(errors="replace"))
    return list(dict.fromkeys(reversed(found)))


def worker_metrics_url(process: WorkerProcess) -> str | None:
    """The health/metrics URL a ``pipeline run`` worker logged last, or None (not up yet)."""
    found = worker_metrics_urls(process)
    return found[0] if found else None


def scrape(
    url: str, keep: Callable[[str], bool], label: str = "stage", timeout: float = 5.0
) -> Values:
    """``(sample name, value of label)`` -> value, summed over the other labels, of the samples
    whose name ``keep`` accepts. Raises OSError when the endpoint does not answer."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    values: Values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if keep(sample.name):
                key = (sample.name, sample.labels.get(label, ""))
                values[key] = values.get(key, 0.0) + sample.value
    return values


def scrape_worker(process: WorkerProcess, keep: Callable[[str], bool]) -> Values:
    """:func:`scrape` of a worker's own endpoint; empty when it has none or does not answer."""
    url = worker_metrics_url(process)
    if url is None:
        return {}
    try:
        return scrape(url, keep)
    except OSError:
        return {}


def delta_mean(
    before: Values, after: Values, name: str, stage: str | None = None, scale: float = 1.0
) -> float | None:
    """A histogram's mean over the phase between two scrapes (of ``stage``, else of all),
    times ``scale`` and rounded to 0.01; None when it observed nothing."""

    def total(values: Values, suffix: str) -> float:
        return sum(v for (n, s), v in values.items() if n == name + suffix and stage in (None, s))

    count = total(after, "_count") - total(before, "_count")
    return (
        round((total(after, "_sum") - total(before, "_sum")) / count * scale, 2)
        if count > 0
        else None
    )
