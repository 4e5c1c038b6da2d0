"""A chain topology's edges: the topics a file leaves out, filled in, and the rules on them.

A chain is a line of stages between ``input_topic`` and ``result_topic``, each stage
consuming the topic the one before produces. A file may name either side of an edge, or
neither (``<topology>.<stage>.out``); the resolution below is the one place those defaults
are made, so the workers, the topic creator and ``pipeline validate`` never disagree, and
the rules on the resolved topics (no topic twice on the chain, none of the topology's other
topics on it) sit beside it. Pure functions over what they read of the stages, so the
model (:class:`pipeline.topology.model.Topology`) uses them without an import cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from pipeline.topology.fields import _TOPIC_MAX, _located


class StageTopics(NamedTuple):
    """The resolved topics of one stage."""

    input: str
    output: str


class ChainStage(Protocol):
    """What :func:`resolve_chain` reads of a stage."""

    @property
    def name(self) -> str: ...
    @property
    def input_topic(self) -> str | None: ...
    @property
    def output_topic(self) -> str | None: ...


def resolve_chain(
    topology: str, stages: Sequence[ChainStage], *, input_topic: str, result_topic: str
) -> list[StageTopics]:
    """Fill in the topics a file leaves out; reject the ones that contradict each other.

    A stage's output defaults to the next stage's explicit input (so setting
    either side of an edge is enough); setting both sides differently would
    leave a gap in the chain and is an error.
    """
    last = len(stages) - 1
    outputs: list[str] = []
    for index, stage in enumerate(stages):
        if index == last:
            default = result_topic
        else:
            following = stages[index + 1].input_topic
            default = following or f"{topology}.{stage.name}.out"
        output = stage.output_topic or default
        if (
            stage.output_topic
            and stage.output_topic != default
            and (index == last or stages[index + 1].input_topic)
        ):
            where = "result_topic" if index == last else f"stages[{index + 1}].input_topic"
            raise _located(
                f"{output!r} differs from {where} {default!r}; "
                "a topology is a linear chain, leave one of them unset",
                ("stages", index, "output_topic"),
            )
        if len(output) > _TOPIC_MAX:
            raise _located(
                f"derived topic name {output!r} is longer than {_TOPIC_MAX} "
                "characters; set output_topic",
                ("stages", index, "name"),
            )
        outputs.append(output)
    first = stages[0].input_topic
    if first is not None and first != input_topic:
        raise _located(
            f"{first!r} differs from the topology's input_topic {input_topic!r}; "
            "the first stage reads the topology's input, leave it unset",
            ("stages", 0, "input_topic"),
        )
    inputs = [input_topic, *outputs[:-1]]
    return [StageTopics(input=i, output=o) for i, o in zip(inputs, outputs, strict=True)]


def chain_topics(chain: Sequence[StageTopics]) -> list[str]:
    """The chain's topics in order (its input, then each stage's output); none may come twice."""
    topics = [chain[0].input, *(t.output for t in chain)]
    for index, topic in enumerate(topics):
        if topics.index(topic) != index:
            # Two edges of the chain on one topic: a stage would read its own output.
            raise _located(
                f"topic {topic!r} appears twice in the stage chain; a stage would "
                "consume its own or a later stage's output",
                ("stages", index - 1, "output_topic"),
            )
    return topics


def check_side_topics(
    topics: Sequence[str], *, shadows: Sequence[tuple[int, str]], dead_letter_topic: str, metrics_topic: str
) -> None:
    """The topics beside the chain (each shadow's, dead letters, metrics) are not on it, and
    dead letters and metrics are two topics; ``shadows``: (stage index, shadow topic)."""
    for index, shadow in shadows:
        if shadow in topics or shadow in (dead_letter_topic, metrics_topic):
            raise _located(f"shadow topic {shadow!r} is also a topic of this topology", ("stages", index, "shadow"))
    for field, topic in (("dead_letter_topic", dead_letter_topic), ("metrics_topic", metrics_topic)):
        if topic in topics:
            raise _located(f"{topic!r} is also a topic of the stage chain", (field,))
    if dead_letter_topic == metrics_topic:
        raise _located(
            "dead_letter_topic and metrics_topic must differ", ("dead_letter_topic",)
        )
