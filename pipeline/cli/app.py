"""The root Typer application every sub-command module attaches to."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    name="pipeline",
    help=(
        "Event-driven streaming inference: Kafka topics in, NVIDIA Triton in the middle, "
        "Kafka topics out. Endpoints come from PIPELINE_* environment variables, or from "
        "the embedded stack started by `pipeline up`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

console = Console()
console_err = Console(stderr=True)
