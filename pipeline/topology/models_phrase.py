"""A stateless stage's models in one phrase, for people (``pipeline validate``, summaries)."""

from __future__ import annotations

from pipeline.topology.model import StatelessStageConfig


def _model(model: str, version: str) -> str:
    return model + (f" version {version}" if version else "")


def describe_models(stage: StatelessStageConfig) -> str:
    """``dense_classifier``; ``routes by key: stable=dense_classifier 90, canary=...``; plus the shadow."""
    if stage.routes:
        if stage.route_by == "task":
            parts = [f"{r.name}={_model(r.model, r.model_version)}" for r in stage.routes]
        else:
            parts = [f"{r.name}={_model(r.model, r.model_version)} {r.weight:g}" for r in stage.routes]
        text = f"routes by {stage.route_by}: {', '.join(parts)}"
    else:
        text = _model(stage.model, stage.model_version)
    if stage.shadow is not None:
        text += f", shadow {_model(stage.shadow.model, stage.shadow.model_version)}"
    return text
