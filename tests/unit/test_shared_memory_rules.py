"""The pure rules of pipeline/triton/shared_memory.py: region names, which regions are
stale, what counts as local, output sizes, and the topology option. The regions
themselves are exercised against the real Triton in tests/integration/test_shared_memory.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError

from pipeline.errors import ConfigError
from pipeline.processes import pid_alive
from pipeline.topology import load_topology
from pipeline.topology.model import StatelessStageConfig
from pipeline.topology.shared_memory import SharedMemoryConfig
from pipeline.triton.shared_memory import (
    OutputSpec,
    RegionPool,
    SharedMemoryOptions,
    aligned,
    is_local,
    is_stale,
    output_specs,
    pid_namespace,
    region_name,
)

NS = 4026531836


def test_region_name_carries_stage_namespace_pid_and_number() -> None:
    assert region_name("big-sum", 123, 4, namespace=NS) == f"pipeline-big-sum-{NS}-123-4"
    assert region_name("a/b c", 1, 0, namespace=NS) == f"pipeline-a_b_c-{NS}-1-0"


def test_stale_means_ours_in_this_namespace_and_its_process_gone() -> None:
    dead = {123}

    def alive(pid: int) -> bool:
        return pid not in dead

    assert is_stale(region_name("s", 123, 0, namespace=NS), "s", NS, alive)
    assert not is_stale(region_name("s", 124, 0, namespace=NS), "s", NS, alive)
    # Another pid namespace: its pids mean nothing here.
    assert not is_stale(region_name("s", 123, 0, namespace=NS + 1), "s", NS, alive)
    # Not our prefix or shape.
    assert not is_stale("someone-else-1-2", "s", NS, alive)
    assert not is_stale(f"pipeline-s-{NS}-x-0", "s", NS, alive)
    # Our own pid under our own stage name: left by an earlier process with the same pid.
    mine = os.getpid()
    assert is_stale(region_name("s", mine, 0, namespace=NS), "s", NS, alive)
    assert not is_stale(region_name("other", mine, 0, namespace=NS), "s", NS, alive)


def test_pid_alive_and_namespace_on_this_host() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(2**22 + 12345)  # above pid_max's default ceiling
    assert pid_namespace() > 0


@pytest.mark.parametrize(
    ("target", "local"),
    [
        ("127.0.0.1:8001", True),
        ("localhost:8001", True),
        ("[::1]:8001", True),
        ("127.1.2.3:8001", True),
        ("10.0.0.5:8001", False),
        ("triton.svc:8001", False),
    ],
)
def test_only_loopback_targets_are_local(target: str, local: bool) -> None:
    assert is_local(target) is local


def test_output_sizes_known_only_for_fixed_numeric_shapes() -> None:
    outputs = [("stats", "FP32", [4]), ("ids", "INT64", [2, 3]), ("text", "BYTES", [1]), ("var", "FP32", [-1])]
    assert output_specs(outputs, rows=5) == [
        OutputSpec("stats", 5 * 4 * 4),
        OutputSpec("ids", 5 * 6 * 8),
        OutputSpec("text", None),
        OutputSpec("var", None),
    ]
    assert output_specs([("scalar", "FP16", [3])], rows=None) == [OutputSpec("scalar", 6)]


def test_tensors_are_placed_on_cache_lines() -> None:
    assert [aligned(n) for n in (0, 1, 64, 65, 1 << 20)] == [0, 64, 64, 128, 1 << 20]


def test_option_defaults_off_and_is_strict() -> None:
    assert SharedMemoryConfig() == SharedMemoryConfig(mode="off", threshold_bytes=256 * 1024)
    with pytest.raises(ValidationError):
        SharedMemoryConfig.model_validate({"mode": "yes"})
    with pytest.raises(ValidationError):
        SharedMemoryConfig.model_validate({"mode": "on", "threshold": 1})
    with pytest.raises(ValidationError):
        SharedMemoryConfig.model_validate({"threshold_bytes": 0})


def test_topology_option_reaches_the_stage_and_a_bad_value_names_its_line(tmp_path: Path) -> None:
    text = """\
name: t
input_topic: requests
result_topic: results
stages:
  - name: big
    kind: stateless
    model: big_sum
    shared_memory:
      mode: {mode}
      threshold_bytes: 1048576
"""
    good = tmp_path / "good.yaml"
    good.write_text(text.format(mode="auto"))
    stage = load_topology(good, environ={}).stages[0]
    assert isinstance(stage, StatelessStageConfig)
    assert stage.shared_memory == SharedMemoryConfig(mode="auto", threshold_bytes=1 << 20)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.format(mode="always"))
    with pytest.raises(ConfigError) as caught:
        load_topology(bad, environ={})
    assert f"{bad}:9" in str(caught.value) and "mode" in str(caught.value)


async def test_a_remote_triton_refuses_on_and_turns_auto_off() -> None:
    """Decided before any call to Triton (no client is needed to refuse)."""
    remote = "10.0.0.5:8001"
    with pytest.raises(ConfigError) as caught:
        await RegionPool(cast(Any, None), "big", SharedMemoryOptions("on")).start(remote)
    assert str(caught.value) == f"stage big: shared_memory mode on, but Triton at {remote} is not a loopback address"
    assert await RegionPool(cast(Any, None), "big", SharedMemoryOptions("auto")).start(remote) is False
