"""Features behind an extra fail with one line naming it when their library is missing.

DALI (``audio``) and matplotlib (``plot``) are installed where the tests run, so each
test hides one: ``sys.modules[name] = None`` in this process (import and lookup then
fail as if it were absent), or an import blocker in a fresh interpreter for the CLI.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.extras import DALI, MATPLOTLIB, MissingExtra, installed, require, require_for_topology
from pipeline.topology import load_topology

REPO = Path(__file__).resolve().parents[2]

BLOCK = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {top!r} or name.startswith({top!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Block())
"""


def _pipeline_cli(hidden: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = BLOCK.format(top=hidden) + f"sys.argv = ['pipeline', *{list(args)!r}]\nfrom pipeline.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.fixture
def no_dali(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_installed_looks_up_without_importing() -> None:
    assert installed("json")
    assert not installed("no_such_module_anywhere")
    assert not installed("no_such_package.sub")  # a missing parent is "not installed", not an error


def test_the_error_names_the_extra(no_dali: None) -> None:
    with pytest.raises(MissingExtra) as caught:
        require("stage 'x' (kind: dali)", DALI)
    message = str(caught.value)
    assert message == (
        "stage 'x' (kind: dali) needs NVIDIA DALI, which is not installed: "
        "pip install 'streaming-inference-pipeline[audio]'"
    )
    assert "\n" not in message
    assert isinstance(caught.value, ConfigError)  # the CLI prints it as one line, exit 1


def test_a_topology_with_a_dali_stage_needs_the_audio_extra(no_dali: None) -> None:
    audio = load_topology(REPO / "topologies" / "audio.yaml", environ={})
    dali = [s.name for s in audio.stages if s.kind == "dali"]
    others = [s.name for s in audio.stages if s.kind != "dali"]
    assert dali and others
    with pytest.raises(MissingExtra, match=r"\[audio\]"):
        require_for_topology(audio)
    require_for_topology(audio, only=others)  # `--stage vad` alone needs no DALI
    require_for_topology(load_topology(REPO / "topologies" / "dense.yaml", environ={}))


def test_the_dali_preprocessor_names_the_extra(no_dali: None) -> None:
    from pipeline.audio.dali_preprocess import AudioPreprocessor

    with pytest.raises(MissingExtra, match=r"pip install 'streaming-inference-pipeline\[audio\]'"):
        AudioPreprocessor(device="cpu")


def test_the_plot_names_the_extra(no_matplotlib: None, tmp_path: Path) -> None:
    from pipeline.tools.bench.plot import write_plot

    with pytest.raises(MissingExtra, match=r"pipeline bench --plot needs matplotlib.*\[plot\]'$"):
        write_plot(None, tmp_path / "x.png", title="x")  # type: ignore[arg-type]
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(MissingExtra):
        require("pipeline bench --plot", MATPLOTLIB)


def test_pipeline_run_without_dali_fails_in_one_line_before_starting_anything() -> None:
    done = _pipeline_cli("nvidia.dali", "run", "topologies/audio.yaml")
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "needs NVIDIA DALI" in lines[0] and "pip install 'streaming-inference-pipeline[audio]'" in lines[0]
    assert "embedded stack" not in done.stdout + done.stderr


def test_pipeline_bench_plot_without_matplotlib_fails_in_one_line_before_the_sweep(tmp_path: Path) -> None:
    done = _pipeline_cli("matplotlib", "bench", "topologies/dense.yaml", "--plot", str(tmp_path / "sweep.png"))
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "pipeline bench --plot needs matplotlib" in lines[0]
    assert "pip install 'streaming-inference-pipeline[plot]'" in lines[0]
