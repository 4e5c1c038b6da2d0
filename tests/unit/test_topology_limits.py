"""Hostile topology files: alias nesting ("billion laughs") is refused quickly, with a line."""

from __future__ import annotations

import time

import pytest

from pipeline.errors import ConfigError
from pipeline.topology import parse_topology


def _nested_aliases(depth: int) -> str:
    lines = ["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, depth)]
    valid = "name: t\ninput_topic: a\nresult_topic: b\nstages: [{name: s, kind: stateless, model: m}]\n"
    return "\n".join(lines) + "\n" + valid + f"x-bomb: *a{depth - 1}\n"


@pytest.mark.parametrize("depth", [18, 24, 40])
def test_alias_expansion_is_bounded(depth: int) -> None:
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"expands to more than 100,000 values") as caught:
        parse_topology(_nested_aliases(depth), "bomb.yaml")
    assert time.perf_counter() - started < 5, "refused, not expanded (depth 18 took 5.9 s before the bound)"
    assert str(caught.value).startswith("bomb.yaml:") and "\n" not in str(caught.value)
