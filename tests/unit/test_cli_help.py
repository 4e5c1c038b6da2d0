"""Every command's ``--help`` at 80 (and 120) columns: no ``<bool>``, no lone word on a line, defaults shown.

Why a test: help is the first thing a person reads, and Typer's panels regressed
on all three (a type column with ``<bool>`` on every flag, docstring line breaks
leaving one word on a line, ``deploy k8s`` cutting its defaults off).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.cli.help import wrap

HEADING = re.compile(r"[A-Z][a-z]+:")


def _commands(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            yield from _commands(sub, [*path, name])


COMMANDS = list(_commands(typer.main.get_command(app), []))


def _help(path: list[str], columns: int) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)}, terminal_width=columns)
    assert result.exit_code == 0, result.output
    return result.output


def _defaults_expected(command: Any) -> int:
    """Options whose default the help must show: a real value, not None/False/empty."""
    count = 0
    for param in command.params:
        if param.param_type_name != "option" or param.hidden or param.show_default is False:
            continue
        if param.default is False and param.secondary_opts:  # --load / --no-load: shows "no-load"
            count += 1
            continue
        if param.default is None or param.default is False or param.default in ("", [], ()) or param.name == "help":
            continue
        count += 1
    return count


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_help_renders_cleanly(path: list[str], command: Any, columns: int) -> None:
    text = _help(path, columns)
    assert "<bool>" not in text
    assert "Traceback" not in text
    lone = [line for line in text.splitlines() if len(line.split()) == 1 and not HEADING.fullmatch(line.strip())]
    assert lone == [], f"lines of one word in `pipeline {' '.join(path)} --help`: {lone}"
    too_long = [line for line in text.splitlines() if len(line) > columns]
    assert too_long == []
    shown = re.findall(r"\[[^\]]*\bdefault: ", " ".join(text.split()))
    assert len(shown) == _defaults_expected(command), text


def test_deploy_k8s_shows_every_default_in_full() -> None:
    text = " ".join(_help(["deploy", "k8s"], 80).split())
    for default in ("[default: http://minio:9000]", "[default: models]", "[default: keda]"):
        assert default in text


def test_wrap_moves_a_word_down_instead_of_leaving_it_alone() -> None:
    lines = wrap("one two three four five six seven eight nine ten eleven", 20)
    assert all(len(line.split()) > 1 for line in lines), lines
    assert " ".join(lines) == "one two three four five six seven eight nine ten eleven"


def test_version_and_completion_options() -> None:
    runner = CliRunner()
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("pipeline ")
    root = _help([], 80)
    assert "--install-completion" in root and "--show-completion" in root


def test_topology_is_positional_everywhere() -> None:
    for path in (["produce"], ["consume"], ["top"], ["replay"], ["bench"], ["infer"], ["run"]):
        usage = _help(path, 120).splitlines()[0]
        assert "TOPOLOGY" in usage, usage
