"""The ``pipeline`` command line.

Each sub-command lives in its own module and registers itself on :data:`app`.
:func:`main` turns a :class:`~pipeline.errors.PipelineError` into one line on
stderr and a non-zero exit; a traceback means a bug.
"""

from __future__ import annotations

import sys

from pipeline.cli.app import app, console_err
from pipeline.errors import PipelineError

# Importing registers the sub-commands on `app`.
from pipeline.cli import models as _models  # noqa: E402,F401
from pipeline.cli import stack as _stack  # noqa: E402,F401


def main() -> None:
    try:
        app(standalone_mode=False)
    except PipelineError as exc:
        console_err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # click's own usage errors arrive here with standalone_mode=False
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(130)
        raise


__all__ = ["app", "main"]
