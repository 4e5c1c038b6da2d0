"""Priority lanes: more input topics for one topology, read highest lane first.

A backlog on Kafka is served in order, so a request that matters more waits behind
it however high its Triton ``priority``. A lane is a topic of its own beside the
``input_topic`` (the default, lowest lane): the first stage consumes every lane and
fetches from a lower lane only while the lanes above it have nothing to give
(:mod:`workers.runtime.lanes`). Lanes are declared highest first; a lane may also set the
Triton priority of its requests (a request's own ``priority`` header still wins).

Ordering is per lane: a key's records in two lanes have no order between them, which
is why a first stage that needs per-key order (a sequence stage's chunks) refuses
lanes, and why a graph's fan-out (several steps on the input topic) does too.

This module holds the lane configuration and the pure rules over it (topic names,
checks, lookup); it builds only on :mod:`pipeline.topology.fields`, so the model can use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import NonNegativeInt

from pipeline.errors import ConfigError
from pipeline.topology.fields import Name, TopicName, _Strict

DEFAULT_LANE = "default"
"""The name of the lane made of the topology's ``input_topic`` (the lowest)."""

LANE_INFIX = ".lane."


class LaneConfig(_Strict):
    """One priority lane: its name, its topic and the Triton priority of its requests."""

    name: Name
    """Lowercase letters, digits and '-'; what clients name (``pipeline produce --lane NAME``)."""
    topic: TopicName | None = None
    """The lane's topic; unset = ``<input_topic>.lane.<name>``. Created with the other
    topics, with the same partition count."""
    priority: NonNegativeInt | None = None
    """Triton priority for this lane's requests without a ``priority`` header of their own
    (1 is Triton's highest; 0 or unset: the stage's default)."""


@dataclass(frozen=True)
class Lane:
    """A resolved lane, as stages and clients see it."""

    name: str
    topic: str
    priority: int | None = None


def lane_topic(input_topic: str, lane: LaneConfig) -> str:
    return lane.topic or f"{input_topic}{LANE_INFIX}{lane.name}"


def resolve_lanes(input_topic: str, lanes: Sequence[LaneConfig]) -> tuple[Lane, ...]:
    """Every lane, highest first, the default lane (``input_topic``) last; () when none are declared."""
    if not lanes:
        return ()
    declared = tuple(Lane(lane.name, lane_topic(input_topic, lane), lane.priority) for lane in lanes)
    return (*declared, Lane(DEFAULT_LANE, input_topic))


def lane_problem(
    lanes: Sequence[LaneConfig],
    *,
    input_topic: str,
    other_topics: Mapping[str, str],
    first_stage: tuple[str, str] | None,
) -> tuple[str, tuple[str | int, ...]] | None:
    """The first thing wrong with ``lanes`` as (message, where under the topology), else None.

    ``other_topics``: every topic the topology uses besides lanes, and what it is; ``first_stage``: (name,
    kind) of the stage consuming the input, None for a graph topology."""
    if not lanes:
        return None
    if first_stage is None:
        return "lanes apply to chain topologies: in a graph several steps read the input topic", ("lanes",)
    name, kind = first_stage
    if kind not in ("stateless", "dali"):
        return (
            f"lanes need a stateless or dali first stage; stage {name!r} is a {kind} stage, whose records "
            "of one key must stay in order, and records of one key in two lanes have no order between them",
            ("lanes",),
        )
    names: dict[str, int] = {}
    topics = dict(other_topics)
    for index, lane in enumerate(lanes):
        if lane.name == DEFAULT_LANE:
            return f"lane name {DEFAULT_LANE!r} is the input_topic's own lane; choose another", ("lanes", index, "name")
        if lane.name in names:
            return f"duplicate lane name {lane.name!r} (also lanes[{names[lane.name]}])", ("lanes", index, "name")
        names[lane.name] = index
        topic = lane_topic(input_topic, lane)
        field = "topic" if lane.topic else "name"
        if len(topic) > 249:
            return f"derived lane topic {topic!r} is longer than 249 characters; set topic", ("lanes", index, field)
        if topic in topics:
            return f"lane topic {topic!r} is also the topology's {topics[topic]}", ("lanes", index, field)
        topics[topic] = f"topic of lanes[{index}]"
    return None


def find_lane(lanes: Sequence[Lane], name: str | None) -> Lane | None:
    """The lane called ``name`` (None or ``default``: the input topic's); a one-line
    :class:`ConfigError` naming the lanes there are when there is none."""
    if name is None or (name == DEFAULT_LANE and not lanes):
        return None
    for lane in lanes:
        if lane.name == name:
            return lane
    there = ", ".join(lane.name for lane in lanes) if lanes else f"only {DEFAULT_LANE!r}: it declares no lanes"
    raise ConfigError(f"no lane {name!r} in this topology (lanes: {there})")
