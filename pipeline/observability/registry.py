"""A Prometheus registry that puts the same labels on every series it exposes.

prometheus_client has no constant labels: a ``Counter`` declares its label names
and every ``.labels(...)`` call must give all of them. Adding ``topology`` that
way would touch every call site in every stage, and still miss the collectors we
do not own (process CPU, memory, open files; Python's GC and version). Adding it
once, where the registry hands its samples to the exposition (``/metrics``) and
to the metrics-topic snapshot, labels *every* series, those included, and keeps
``topology`` out of the stages' code: a stage knows its own name, not which
topology runs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric


class LabelledRegistry(CollectorRegistry):
    """A ``CollectorRegistry`` whose collected samples all carry ``labels``.

    A label a sample already has keeps its own value. An empty value is left out
    (Prometheus treats an empty label as an absent one).
    """

    def __init__(self, labels: Mapping[str, str]) -> None:
        super().__init__()
        self.constant_labels = {name: value for name, value in labels.items() if value}

    def collect(self) -> Iterable[Metric]:
        for family in super().collect():
            if self.constant_labels:
                family.samples = [
                    sample._replace(labels={**self.constant_labels, **sample.labels}) for sample in family.samples
                ]
            yield family
