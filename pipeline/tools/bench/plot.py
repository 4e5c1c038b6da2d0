"""The sweep as a PNG: latency against throughput, pipeline and direct Triton on one chart.

The usual way to read a load sweep: each step is a point at (verified
results per second, latency), joined in step order, p50 solid and p99
dashed, so the knee (where latency rises and throughput stops) shows, and the
gap between the two paths is what the topology adds. matplotlib draws it
headless (the Agg backend: no display needed); its only role in the project,
so it comes with the ``plot`` extra and is imported only here, when drawing.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.extras import MATPLOTLIB, require
from pipeline.tools.bench.stats import StepStats
from pipeline.tools.bench.sweep import SweepResult


def write_plot(result: SweepResult, path: Path, *, title: str) -> None:
    """Draw ``result`` into ``path`` (PNG)."""
    require("pipeline bench --plot", MATPLOTLIB)
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    figure, axes = plt.subplots(figsize=(8, 5), dpi=120)
    series: list[tuple[str, str, list[StepStats | None]]] = [
        ("pipeline", "tab:blue", [step.pipeline for step in result.steps])
    ]
    if result.plan.direct:
        series.append(("direct Triton", "tab:orange", [step.direct for step in result.steps]))
    labels = [step.step.label for step in result.steps]
    for name, colour, stats in series:
        for percentile, style in (("p50", "-"), ("p99", "--")):
            points = [
                (s.throughput, value, label)
                for s, label in zip(stats, labels, strict=True)
                if s is not None and (value := s.percentiles()[percentile]) is not None
            ]
            if not points:
                continue
            axes.plot([x for x, _, _ in points], [y for _, y, _ in points], style, marker="o", color=colour, label=f"{name} {percentile}")
            if percentile == "p50":
                for x, y, label in points:
                    axes.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes.set_xlabel("throughput (verified results/s)")
    axes.set_ylabel("latency (ms)")
    axes.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 20, 50, 100 ms rather than 2x10^1
    axes.yaxis.set_major_formatter(plain)
    axes.yaxis.set_minor_formatter(plain)
    axes.set_title(title.replace("; ", "\n"), fontsize=9)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
