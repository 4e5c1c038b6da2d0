"""The graph the join-progress unit tests reason about: prep, then a -> calibrate and b in
parallel, their outputs met by the result join."""

from __future__ import annotations

from typing import Any

from pipeline.topology.graph import Graph, StepSpec, compile_graph


def two_branch_graph(**join: Any) -> Graph:
    """``join``: the result join's settings (``result_join_gone_after_s``, ...)."""
    return compile_graph(
        topology="t",
        steps=[
            StepSpec("prep", {"raw": "raw"}, {"features": "features"}),
            StepSpec("a", {"x": "features"}, {"y": "logits"}),
            StepSpec("calibrate", {"x": "logits"}, {"y": "calibrated"}),
            StepSpec("b", {"x": "features"}, {"y": "score"}),
        ],
        inputs=["raw"],
        outputs=["calibrated", "score"],
        input_topic="t.in",
        result_topic="t.out",
        **join,
    )
