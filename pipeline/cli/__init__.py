"""The ``pipeline`` command line.

Each sub-command lives in its own module and registers itself on :data:`app`.
:func:`main` turns a :class:`~pipeline.errors.PipelineError` into one line on
stderr and a non-zero exit; a traceback means a bug.
"""

from __future__ import annotations

import sys

from rich.markup import escape

# Importing registers the sub-commands on `app`.
from pipeline.cli import bench as _bench  # noqa: F401
from pipeline.cli import consume as _consume  # noqa: F401
from pipeline.cli import deploy as _deploy  # noqa: F401
from pipeline.cli import models as _models  # noqa: F401
from pipeline.cli import produce as _produce  # noqa: F401
from pipeline.cli import replay as _replay  # noqa: F401
from pipeline.cli import run as _run  # noqa: F401
from pipeline.cli import stack as _stack  # noqa: F401
from pipeline.cli import top as _top  # noqa: F401
from pipeline.cli import validate as _validate  # noqa: F401
from pipeline.cli.app import app, console_err
from pipeline.errors import PipelineError


def main() -> None:
    """Run the CLI; user errors become one line on stderr and exit code 1."""
    try:
        app()  # standalone: click prints usage errors itself and exits 2
    except PipelineError as exc:
        console_err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)  # `[audio]` is text
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


__all__ = ["app", "main"]
