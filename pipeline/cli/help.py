"""``--help`` as plain, reflowed text that reads well at 80 columns and at 120.

Why our own rendering instead of Typer's rich panels: the panels spend a third
of an 80-column terminal on a type column (``<bool>`` next to every flag),
squeeze the help into the rest so defaults get cut off (``deploy k8s``), and
keep the docstrings' hard line breaks, which leave a lone word on a line once
the text is re-wrapped. Here every paragraph is joined and re-wrapped to the
terminal, a last line of one word takes a word from the line above, flags
show no type, and ``[default: ...]`` always fits because it wraps with the text.
A paragraph starting with ``\\b`` keeps its line breaks (click's convention).
"""

from __future__ import annotations

import inspect
import re
import shutil
import textwrap
from typing import Any

from typer.core import TyperCommand, TyperGroup

MAX_WIDTH = 120
_TERM_SHARE = 0.36
"""Most of the width the option/command column may take before its help starts below it."""
_TYPE_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "bool": ""}


def help_width(ctx: Any) -> int:
    """The terminal's width (``COLUMNS`` honoured), at most :data:`MAX_WIDTH`."""
    columns = getattr(ctx, "terminal_width", None) or shutil.get_terminal_size((80, 24)).columns
    return max(40, min(int(columns), MAX_WIDTH))


def wrap(text: str, width: int) -> list[str]:
    """Greedy wrap, then no last line of a single word (it takes words from the line above)."""
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)
    while len(lines) > 1 and len(lines[-1].split()) == 1 and len(lines[-2].split()) >= 3:
        *head, moved = lines[-2].split()
        candidate = f"{moved} {lines[-1]}"
        if len(candidate) > width:
            break
        lines[-2:] = [" ".join(head), candidate]
    return lines


def paragraphs(text: str) -> list[tuple[bool, str]]:
    """(keep line breaks, text) per paragraph of a docstring."""
    found = []
    for block in re.split(r"\n\s*\n", inspect.cleandoc(text)):
        if block.startswith("\b"):
            found.append((True, block.removeprefix("\b").lstrip("\n")))
        elif block.strip():
            found.append((False, " ".join(block.split())))
    return found


def _indented(text: str, width: int, indent: int) -> list[str]:
    lines: list[str] = []
    for index, (verbatim, paragraph) in enumerate(paragraphs(text)):
        if index:
            lines.append("")
        body = paragraph.splitlines() if verbatim else wrap(paragraph, width - indent)
        lines.extend(" " * indent + line for line in body)
    return lines


def _term(text: str) -> str:
    """Typer's ``--count <int range>`` as ``--count INTEGER``; choices as ``[a|b]``."""

    def name(match: re.Match[str]) -> str:
        inner = match.group(1)
        if "|" in inner:
            return f"[{inner}]"
        base = inner.removesuffix(" range")
        return _TYPE_NAMES.get(base, base.upper())

    return re.sub(r"\s*<([^<>]+)>", lambda m: (" " + name(m)).rstrip(), text)


def definition_list(rows: list[tuple[str, str]], width: int) -> list[str]:
    """Two columns, the second wrapped; a term too long for its column puts its text below."""
    if not rows:
        return []
    limit = int(width * _TERM_SHARE)
    column = max((len(term) for term, _ in rows if len(term) <= limit), default=limit)
    text_width = width - column - 4
    lines: list[str] = []
    for term, text in rows:
        body = wrap(" ".join(text.split()), text_width) if text else []
        if len(term) <= column:
            first = body.pop(0) if body else ""
            lines.append(f"  {term.ljust(column)}  {first}".rstrip())
        else:
            lines.append(f"  {term}")
        lines.extend(" " * (column + 4) + line for line in body)
    return lines


def _short_help(command: Any) -> str:
    if command.short_help:
        return str(command.short_help)
    found = paragraphs(command.help or "")
    return found[0][1] if found else ""


def render_help(command: Any, ctx: Any) -> str:
    """The whole ``--help`` text of ``command``."""
    width = help_width(ctx)
    pieces = re.sub(r"\{([^{}]+)\}", r"\1", " ".join(command.collect_usage_pieces(ctx)))
    usage = wrap(f"Usage: {ctx.command_path} {pieces}", width)
    lines = [usage[0], *("  " + line for line in wrap(" ".join(usage[1:]), width - 2))] if usage else []
    if command.help:
        lines += ["", *_indented(command.help, width, 2)]
    arguments: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        if param.param_type_name == "argument":  # its name alone: the type is in its help
            arguments.append((param.display_name_raw.upper(), record[1]))
        else:
            options.append((_term(record[0]), record[1]))
    for title, rows in (("Arguments", arguments), ("Options", options)):
        if rows:
            lines += ["", f"{title}:", *definition_list(rows, width)]
    if isinstance(command, TyperGroup):
        commands: list[tuple[str, str]] = []
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                commands.append((name, _short_help(sub)))
        if commands:
            lines += ["", "Commands:", *definition_list(commands, width)]
    if command.epilog:
        lines += ["", *_indented(command.epilog, width, 2)]
    return "\n".join(lines) + "\n"


class PipelineCommand(TyperCommand):
    """A Typer command whose ``--help`` is :func:`render_help`'s."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(render_help(self, ctx))


class PipelineGroup(TyperGroup):
    """A Typer group rendering its help, and its commands' help, with :func:`render_help`.

    Commands registered without ``cls`` (``up``/``down`` among them) are built by Typer as
    plain ``TyperCommand``s; they become :class:`PipelineCommand`s here, in one place, so no
    command can be left with the other rendering."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for command in self.commands.values():
            if type(command) is TyperCommand:
                command.__class__ = PipelineCommand

    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(render_help(self, ctx))
