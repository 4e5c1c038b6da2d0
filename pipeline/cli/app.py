"""The root Typer application every sub-command module attaches to.

``--version`` prints the installed distribution's version; ``--install-completion``
and ``--show-completion`` are Typer's, for bash, zsh, fish and PowerShell. Help is
rendered by :mod:`pipeline.cli.help` (plain text, reflowed to the terminal).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from pipeline.cli.help import PipelineGroup

DISTRIBUTION = "streaming-inference-pipeline"

app = typer.Typer(
    name="pipeline",
    cls=PipelineGroup,
    help=(
        "Event-driven streaming inference: Kafka topics in, NVIDIA Triton in the middle, "
        "Kafka topics out. Endpoints come from flags (-b, --triton, --s3), PIPELINE_* "
        "environment variables, or the embedded stack started by `pipeline up`; each command "
        "names the ones it uses on its first stderr line."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

console = Console()
console_err = Console(stderr=True)


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"pipeline {version(DISTRIBUTION)}"
    except PackageNotFoundError:  # a source tree that was never installed
        return "pipeline (version unknown: the package is not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Options of `pipeline` itself (the help text is the app's)."""
