"""Ensemble graphs: steps wired by tensor names, compiled to Kafka topics and join nodes.

Triton's ensemble semantics, run across Kafka: each step maps model tensor
names to topology-wide tensor names (``input_map`` / ``output_map``); a step
runs when all its inputs exist. Messages between steps carry every topology
tensor known on their path (the request's inputs and the outputs of every step
upstream), so a step needs just one incoming message per request:

- a step whose inputs are all topology inputs consumes the request topic;
- a step whose inputs come from one branch consumes that branch's output topic
  (fan-out is several steps consuming one topic, each in its own consumer group);
- a step whose inputs come from several parallel branches gets a **join** node
  in front of it, which merges the branches' messages by correlation ID within a
  window (``inner``, ``outer`` or ``any``); the result topic likewise.

Compilation is pure: it also validates (cycles with their path, tensors
consumed but never produced, tensors produced twice) with messages that name
the steps involved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

JoinMode = Literal["inner", "outer", "any"]

BRANCH_GONE_AFTER_S = 180.0
"""Default ``branch_gone_after``: no live member in a branch's group this long and it is gone."""
MAX_WAIT_S = 600.0
"""Default ``max_wait``: the hard limit on an open join window."""


class GraphError(ValueError):
    """An invalid graph; ``step`` names the step the message is about (None: the topology)."""

    def __init__(self, message: str, step: str | None = None, field_name: str = "input_map") -> None:
        super().__init__(message)
        self.step = step
        self.field_name = field_name


@dataclass(frozen=True)
class StepSpec:
    """What the compiler needs of a step: its name and its tensor maps."""

    name: str
    input_map: Mapping[str, str]  # model input -> topology tensor
    output_map: Mapping[str, str]  # model output -> topology tensor
    join_mode: JoinMode = "inner"
    join_window_ms: float = 5000.0
    join_gone_after_s: float = BRANCH_GONE_AFTER_S
    join_max_wait_s: float | None = MAX_WAIT_S

    @property
    def needs(self) -> set[str]:
        return set(self.input_map.values())

    @property
    def produces(self) -> set[str]:
        return set(self.output_map.values())


@dataclass(frozen=True)
class JoinNode:
    """Merges the messages of ``branches`` (step names) for one correlation ID."""

    name: str
    branches: tuple[str, ...]
    input_topics: tuple[str, ...]
    output_topic: str
    mode: JoinMode
    window_ms: float
    feeds: str  # the step it feeds, or "result"
    branch_gone_after_s: float = BRANCH_GONE_AFTER_S
    max_wait_s: float | None = MAX_WAIT_S


@dataclass(frozen=True)
class StepNode:
    name: str
    input_topic: str
    output_topic: str
    upstream: tuple[str, ...]  # the steps (or join) whose messages it consumes
    to_result: bool  # writes the topology result (selected outputs) instead of a message


@dataclass
class Graph:
    steps: dict[str, StepNode] = field(default_factory=dict)
    joins: dict[str, JoinNode] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # steps in dependency order

    def topics(self) -> list[str]:
        seen: dict[str, None] = {}
        for node in self.steps.values():
            seen.setdefault(node.input_topic)
            seen.setdefault(node.output_topic)
        for join in self.joins.values():
            for topic in join.input_topics:
                seen.setdefault(topic)
            seen.setdefault(join.output_topic)
        return list(seen)

    def feeding(self, join: str) -> list[tuple[str, str]]:
        """``(stage, input topic)`` of every step and join upstream of ``join``: what must
        have finished its input before a branch the join has read to its end is complete."""
        return sorted({(stage, topic) for branch in self.joins[join].branches for stage, topic, _ in self.chain(branch)})

    def chain(self, branch: str) -> list[tuple[str, str, int]]:
        """``(stage, input topic, depth)`` of ``branch`` (depth 0) and of every step and join
        upstream of it (depth: hops from the branch, the shortest), nearest first: the
        groups whose progress decides whether the branch can still deliver."""
        found: dict[tuple[str, str], int] = {}
        todo, seen = [(branch, 0)], set()
        while todo:
            name, depth = todo.pop(0)  # breadth first: the shortest depth wins
            if name in seen:
                continue
            seen.add(name)
            if name in self.steps:
                step = self.steps[name]
                found.setdefault((name, step.input_topic), depth)
                todo += [(up, depth + 1) for up in step.upstream]
            else:
                node = self.joins[name]
                for topic in node.input_topics:
                    found.setdefault((name, topic), depth)
                todo += [(up, depth + 1) for up in node.branches]
        return sorted(((stage, topic, depth) for (stage, topic), depth in found.items()), key=lambda f: (f[2], f[0], f[1]))


def compile_graph(
    *,
    topology: str,
    steps: Sequence[StepSpec],
    inputs: Sequence[str],
    outputs: Sequence[str],
    input_topic: str,
    result_topic: str,
    result_join_mode: JoinMode = "inner",
    result_join_window_ms: float = 5000.0,
    result_join_gone_after_s: float = BRANCH_GONE_AFTER_S,
    result_join_max_wait_s: float | None = MAX_WAIT_S,
) -> Graph:
    """Validate the graph and derive topics and join nodes (see the module docstring)."""
    by_name = {s.name: s for s in steps}
    producer = _producers(steps, inputs)
    for step in steps:
        for tensor in sorted(step.needs):
            if tensor not in producer:
                raise GraphError(
                    f"step {step.name!r} consumes tensor {tensor!r}, which no step produces "
                    f"and which is not a topology input",
                    step.name,
                )
    for tensor in outputs:
        if tensor not in producer:
            raise GraphError(f"output {tensor!r} is produced by no step and is not a topology input", None, "outputs")
    deps = {s.name: {p for t in s.needs if (p := producer[t]) is not None} for s in steps}
    order = _topological_order(deps)
    ancestors = _ancestors(deps, order)
    graph = Graph(order=order)
    out_topic = {name: f"{topology}.{name}.out" for name in by_name}

    def upstream_of(required: set[str]) -> tuple[str, ...]:
        direct = {p for t in required if (p := producer[t]) is not None}
        # A branch's messages already carry its ancestors' tensors: keep the frontier only.
        frontier = {d for d in direct if not any(d in ancestors[o] for o in direct if o != d)}
        return tuple(name for name in order if name in frontier)

    result_upstream = upstream_of(set(outputs))
    consumers: dict[str, int] = {name: 0 for name in by_name}
    for step in steps:
        for up in upstream_of(step.needs):
            consumers[up] += 1
    for up in result_upstream:
        consumers[up] += 1

    def add_join(feeds: str, branches: tuple[str, ...], topic: str, timing: _Timing) -> None:
        """The join of ``branches`` (read from their out topics) for ``feeds``, writing ``topic``."""
        name = f"join-{feeds}"
        graph.joins[name] = JoinNode(
            name=name,
            branches=branches,
            input_topics=tuple(out_topic[b] for b in branches),
            output_topic=topic,
            mode=timing[0],
            window_ms=timing[1],
            feeds=feeds,
            branch_gone_after_s=timing[2],
            max_wait_s=timing[3],
        )

    def source_topic(feeds: str, upstream: tuple[str, ...], timing: _Timing) -> str:
        if not upstream:
            return input_topic
        if len(upstream) == 1:
            return out_topic[upstream[0]]
        topic = f"{topology}.join-{feeds}.out"
        add_join(feeds, upstream, topic, timing)
        return topic

    # The result needs no node of its own when exactly one step produces every output
    # and nothing else reads that step: it writes the result topic directly.
    direct_result = (
        result_upstream[0] if len(result_upstream) == 1 and consumers[result_upstream[0]] == 1 else None
    )
    for name in order:
        spec = by_name[name]
        upstream = upstream_of(spec.needs)
        graph.steps[name] = StepNode(
            name=name,
            input_topic=source_topic(
                name, upstream, (spec.join_mode, spec.join_window_ms, spec.join_gone_after_s, spec.join_max_wait_s)
            ),
            output_topic=result_topic if name == direct_result else out_topic[name],
            upstream=upstream,
            to_result=name == direct_result,
        )
    if direct_result is None:
        if not result_upstream:
            raise GraphError("outputs must include a tensor produced by a step", None, "outputs")
        timing = (result_join_mode, result_join_window_ms, result_join_gone_after_s, result_join_max_wait_s)
        add_join("result", result_upstream, result_topic, timing)
    return graph


_Timing = tuple[JoinMode, float, float, float | None]
"""A join's mode, window_ms, branch_gone_after_s and max_wait_s."""


def _producers(steps: Sequence[StepSpec], inputs: Sequence[str]) -> dict[str, str | None]:
    """tensor -> the step producing it (None: a topology input); rejects a second producer."""
    producer: dict[str, str | None] = {t: None for t in inputs}
    for step in steps:
        for tensor in sorted(step.produces):
            if tensor in producer:
                first = producer[tensor]
                other = "the topology's inputs" if first is None else f"step {first!r}"
                raise GraphError(
                    f"tensor {tensor!r} is produced twice: by {other} and by step {step.name!r}",
                    step.name,
                    "output_map",
                )
            producer[tensor] = step.name
    return producer


def _topological_order(deps: Mapping[str, set[str]]) -> list[str]:
    """Steps in dependency order; a cycle is an error naming its path."""
    order: list[str] = []
    state: dict[str, str] = {}  # visiting | done
    path: list[str] = []

    def visit(name: str) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            needs = path[path.index(name) :] + [name]  # each step needs the next one's output
            flow = " -> ".join(reversed(needs))  # the same cycle in the direction data flows
            raise GraphError(f"cycle: {flow} (each step consumes the previous one's output)", name)
        state[name] = "visiting"
        path.append(name)
        for dep in sorted(deps[name]):
            visit(dep)
        path.pop()
        state[name] = "done"
        order.append(name)

    for name in deps:  # file order, so the order is stable and readable
        visit(name)
    return order


def _ancestors(deps: Mapping[str, set[str]], order: Sequence[str]) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for name in order:  # dependencies first
        result[name] = set(deps[name]).union(*(result[d] for d in deps[name])) if deps[name] else set()
    return result
