"""Check a topology against the models Triton actually serves.

A topology names models and tensors; only Triton knows whether they exist
and what they look like. Catching a mismatch here (``pipeline validate``,
worker start-up) turns what would be a dead-letter topic full of
"unexpected input" errors into one readable list before any record flows.

Tensor names follow Triton ensemble semantics: a stage's ``input_map`` says
which *topology tensor* feeds each model input, its ``output_map`` under
which topology tensor name each model output is published; an empty map
means the names are the same. Between chained stages, every required input
of the next model must be published by the previous one, with the same
datatype and a compatible per-item shape (``-1`` matches any size).

Model metadata comes through a ``describe`` callable, so this module needs
no Triton connection and is pure logic; :class:`pipeline.triton.admin.TritonAdmin`
provides the real one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline.errors import EndpointUnreachable
from pipeline.topology.described import Describe, ModelLike, TensorLike
from pipeline.topology.fusion import fusable_problems
from pipeline.topology.model import SequenceStageConfig, Stage, StatelessStageConfig, Topology
from pipeline.topology.padding_compat import check_padding

__all__ = ["Describe", "ModelLike", "TensorLike", "check_compatibility", "shapes_compatible"]


@dataclass(frozen=True)
class _Binding:
    """How one stage binds a Triton model's tensors to topology tensor names."""

    stage: str
    model: str
    version: str
    input_map: Mapping[str, str]
    output_map: Mapping[str, str]
    max_batch_size: int | None


def _bindings(stage: Stage) -> list[_Binding]:
    """Every model a stage calls: its model, or each route's, then its shadow's.
    The first is the one its neighbours' tensors are checked against."""
    if isinstance(stage, StatelessStageConfig) and (stage.routes or stage.shadow):
        targets = [(r.model, r.model_version) for r in stage.routes or ()] or [(stage.model, stage.model_version)]
        if stage.shadow is not None:
            targets.append((stage.shadow.model, stage.shadow.model_version))
        size = stage.batching.max_batch_size
        return [_Binding(stage.name, m, v, stage.input_map, stage.output_map, size) for m, v in targets]
    binding = _binding(stage)
    return [] if binding is None else [binding]


def _binding(stage: Stage) -> _Binding | None:
    """The model binding of a stage that calls Triton; None for in-process stages (DALI)."""
    if isinstance(stage, StatelessStageConfig):
        return _Binding(
            stage.name,
            stage.model,
            stage.model_version,
            stage.input_map,
            stage.output_map,
            stage.batching.max_batch_size,
        )
    if isinstance(stage, SequenceStageConfig):
        return _Binding(stage.name, stage.model, "", {}, {}, None)
    return None


def _model_label(binding: _Binding) -> str:
    version = f" version {binding.version}" if binding.version else ""
    return f"model {binding.model!r}{version}"


def shapes_compatible(produced: Sequence[int], consumed: Sequence[int]) -> bool:
    """Same rank, and every dimension equal or variable (-1) on either side."""
    return len(produced) == len(consumed) and all(
        p == c or p == -1 or c == -1 for p, c in zip(produced, consumed, strict=True)
    )


def _check_maps(binding: _Binding, model: ModelLike) -> list[str]:
    problems = []
    for field, mapping, tensors, what in (
        ("input_map", binding.input_map, model.inputs, "input"),
        ("output_map", binding.output_map, model.outputs, "output"),
    ):
        names = [t.name for t in tensors]
        for key in mapping:
            if key not in names:
                problems.append(
                    f"stage {binding.stage!r}: {field} key {key!r} is not an {what} of "
                    f"{_model_label(binding)} (its {what}s: {', '.join(names) or 'none'})"
                )
    published: dict[str, str] = {}
    for output in model.outputs:
        topology_name = binding.output_map.get(output.name, output.name)
        if topology_name in published:
            problems.append(
                f"stage {binding.stage!r}: outputs {published[topology_name]!r} and "
                f"{output.name!r} are both published as {topology_name!r}"
            )
        published.setdefault(topology_name, output.name)
    return problems


def _check_batch_size(binding: _Binding, model: ModelLike) -> list[str]:
    wanted = binding.max_batch_size
    if wanted is None:
        return []
    if model.max_batch_size == 0 and wanted > 1:
        return [
            (
                f"stage {binding.stage!r}: batching.max_batch_size is {wanted} but "
                f"{_model_label(binding)} does not batch (max_batch_size 0)"
            )
        ]
    if model.max_batch_size > 0 and wanted > model.max_batch_size:
        return [
            (
                f"stage {binding.stage!r}: batching.max_batch_size {wanted} exceeds the "
                f"max_batch_size {model.max_batch_size} of {_model_label(binding)}"
            )
        ]
    return []


def _check_edge(
    producer: _Binding, produced_by: ModelLike, consumer: _Binding, consumed_by: ModelLike
) -> list[str]:
    """Every required input of ``consumer`` is published by ``producer``, same type and shape."""
    published = {producer.output_map.get(t.name, t.name): t for t in produced_by.outputs}
    problems = []
    for needed in consumed_by.inputs:
        topology_name = consumer.input_map.get(needed.name, needed.name)
        via = f" (topology tensor {topology_name!r})" if topology_name != needed.name else ""
        source = published.get(topology_name)
        if source is None:
            if not needed.optional:
                problems.append(
                    f"stage {consumer.stage!r}: input {needed.name!r}{via} is not produced "
                    f"by stage {producer.stage!r} (it produces: "
                    f"{', '.join(published) or 'nothing'})"
                )
            continue
        if source.datatype.upper() != needed.datatype.upper():
            problems.append(
                f"stage {consumer.stage!r}: input {needed.name!r}{via} is {needed.datatype} "
                f"but stage {producer.stage!r} produces it as {source.datatype}"
            )
        elif not shapes_compatible(source.shape, needed.shape):
            problems.append(
                f"stage {consumer.stage!r}: input {needed.name!r}{via} has shape "
                f"{list(needed.shape)} but stage {producer.stage!r} produces "
                f"{list(source.shape)}"
            )
    return problems


def _describe_binding(
    binding: _Binding, describe: Describe, cache: dict[tuple[str, str], ModelLike | Exception]
) -> tuple[_Binding, ModelLike | Exception]:
    """Describe the model of ``binding`` once per (model, version)."""
    key = (binding.model, binding.version)
    if key not in cache:
        try:
            cache[key] = describe(binding.model, binding.version)
        except EndpointUnreachable:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure means "cannot use this model"
            cache[key] = exc
    return binding, cache[key]


def check_compatibility(topology: Topology, describe: Describe) -> list[str]:
    """Problems between ``topology`` and the served models, one sentence each; [] = compatible.

    Each problem names the stage and, where it applies, the tensor; they come
    in stage order. A model that cannot be described is reported once per
    stage and its other checks are skipped.
    :class:`~pipeline.errors.EndpointUnreachable` propagates: when nothing
    answers, "every model is missing" would be the wrong diagnosis.
    """
    problems: list[str] = []
    cache: dict[tuple[str, str], ModelLike | Exception] = {}
    previous: tuple[_Binding, ModelLike] | None = None
    for stage in topology.stages:
        current: tuple[_Binding, ModelLike] | None = None
        for index, binding in enumerate(_bindings(stage)):
            _, answer = _describe_binding(binding, describe, cache)
            if isinstance(answer, Exception):
                reason = " ".join(str(answer).split()) or type(answer).__name__
                problems.append(
                    f"stage {stage.name!r}: {_model_label(binding)} unavailable: {reason}"
                )
            else:
                if index == 0:
                    current = (binding, answer)
                problems += _check_maps(binding, answer)
                problems += _check_batch_size(binding, answer)
                if isinstance(stage, StatelessStageConfig) and stage.padding is not None:
                    problems += check_padding(stage.name, stage.padding, answer, _model_label(binding))
        # Stages form a linear chain (the model guarantees output[i] == input[i+1]); an
        # edge that touches an in-process (DALI) or undescribable stage cannot be checked.
        # Graph topologies are wired by tensor names, not by position: their edges are
        # checked by the graph compiler (names) and here per step (maps against the model).
        if previous is not None and current is not None and not topology.is_graph:
            problems += _check_edge(*previous, *current)
        previous = current
    return problems + _check_fused(topology, cache)


def _check_fused(topology: Topology, cache: dict[tuple[str, str], ModelLike | Exception]) -> list[str]:
    """Every member of a fused chain must be able to run inside a Triton ensemble."""
    problems = []
    for chain in topology.fuse:
        for step in chain.steps:
            stage = topology.stage(step)
            assert isinstance(stage, StatelessStageConfig)
            model = cache.get((stage.model, stage.model_version))
            if model is None or isinstance(model, Exception):
                continue  # already reported as unavailable
            problems += fusable_problems(
                step,
                stage.model,
                max_batch_size=model.max_batch_size,
                # Read when the description has them (Triton's does; hand-made ones may not).
                sequence=getattr(model, "sequence_batching", None) is not None,
                decoupled=bool(getattr(model, "decoupled", False)),
            )
    return problems
