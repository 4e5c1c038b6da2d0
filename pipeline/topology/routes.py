"""Several models behind one stateless stage: weighted routes, task routes, a shadow.

A stage names either one ``model`` or a list of ``routes``. Each route is a
named (model, version). ``route_by`` decides which route serves a record:

- ``key`` (canary / A-B): every route has a ``weight``; the record key (else its
  correlation ID) is hashed with a stable hash into the cumulative weights, so a
  key always sees the same route, in every process and after every restart.
- ``task`` (multi-task): the record's ``task`` header names the route; no weights
  (they would mean nothing). A missing or unknown task is dead-lettered
  ``unknown-task``.

``shadow`` mirrors every request to one more model, best effort: its results go
to the shadow topic (default ``<stage output topic>.shadow``), never to the
stage's output, and nothing about it can delay or change the main result.

These models are imported by :mod:`pipeline.topology.model`; the rules that need
the whole stage live in :func:`check_routes` (called by the stage's validator), so
that module only gains the fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import Field, NonNegativeFloat, PositiveInt

from pipeline.topology.fields import ModelVersion, Name, TopicName, _located, _Strict

RouteBy = Literal["key", "task"]
SHADOW_SUFFIX = ".shadow"


class RouteConfig(_Strict):
    """One model a stage may send a request to."""

    name: Name
    """The route's name: the ``pipeline-route`` header of its results, the ``route`` label of
    its metrics and, with ``route_by: task``, the value of the ``task`` header that selects it."""
    model: str = Field(min_length=1)
    """Triton model name."""
    model_version: ModelVersion = ""
    """"" = the latest version Triton serves; else a pinned version number."""
    weight: NonNegativeFloat | None = None
    """route_by key: this route's share of the keys (relative to the others' weights; 0 parks
    the route); route_by task: leave unset."""


class ShadowConfig(_Strict):
    """A model every request is mirrored to; its results go to the shadow topic only."""

    model: str = Field(min_length=1)
    """Triton model name of the shadow."""
    model_version: ModelVersion = ""
    """"" = the latest version Triton serves; else a pinned version number."""
    topic: TopicName | None = None
    """Where the shadow's results go; null = <stage output topic>.shadow (created with the others)."""
    max_inflight: PositiveInt = 16
    """Shadow calls in flight at once, per worker; a batch mirrored while they are all busy
    is dropped (counted in pipeline_shadow_total{outcome="dropped"}), never waited for."""


def shadow_topic(shadow: ShadowConfig, output_topic: str) -> str:
    """The shadow's topic: its own, else ``<output_topic>.shadow``."""
    return shadow.topic or f"{output_topic}{SHADOW_SUFFIX}"


class RoutedStage(Protocol):
    """What :func:`check_routes` reads of a stateless stage."""

    @property
    def model(self) -> str: ...
    @property
    def model_version(self) -> str: ...
    @property
    def routes(self) -> Sequence[RouteConfig] | None: ...
    @property
    def route_by(self) -> RouteBy: ...


def check_routes(stage: RoutedStage) -> None:
    """The rules between ``model``, ``routes``, ``route_by`` and the weights (raise located errors)."""
    routes = stage.routes
    if routes is None:
        if not stage.model:
            raise _located("missing required key (give the stage's model, or its routes)", ("model",))
        if stage.route_by != "key":
            raise _located("route_by: task chooses among routes; this stage has none", ("route_by",))
        return
    if stage.model or stage.model_version:
        field = "model" if stage.model else "model_version"
        raise _located("give either model or routes, not both (each route names its model)", (field,))
    names: dict[str, int] = {}
    served: dict[tuple[str, str], int] = {}
    for index, route in enumerate(routes):
        if route.name in names:
            raise _located(
                f"duplicate route name {route.name!r} (also routes[{names[route.name]}])", ("routes", index, "name")
            )
        names[route.name] = index
        target = (route.model, route.model_version)
        if target in served:
            raise _located(
                f"routes[{served[target]}] already serves model {route.model!r}"
                + (f" version {route.model_version}" if route.model_version else ""),
                ("routes", index, "model"),
            )
        served[target] = index
        if stage.route_by == "task" and route.weight is not None:
            raise _located(
                "with route_by: task the task header chooses the route; weights would mean nothing, remove it",
                ("routes", index, "weight"),
            )
        if stage.route_by == "key" and route.weight is None:
            raise _located("route_by: key needs a weight on every route", ("routes", index))
    if stage.route_by == "key" and not any(route.weight for route in routes):
        raise _located("every route's weight is 0: no route could serve a record", ("routes",))
