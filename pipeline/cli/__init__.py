"""The ``pipeline`` command line.

Each sub-command lives in its own module and registers itself on :data:`app`.
:func:`main` turns a :class:`~pipeline.errors.PipelineError` into one line on
stderr and a non-zero exit; a traceback means a bug. Exit codes: 0 success,
1 an error (one line on stderr), 2 a usage error (click's) or, for ``pipeline
infer``, a dead letter; 130 after Ctrl-C.

While it runs, ``sys.stderr`` is wrapped so the endpoints line
(:mod:`pipeline.cli.connection`) comes before anything else written there.
"""

from __future__ import annotations

import sys

from rich.markup import escape

# Importing registers the sub-commands on `app`.
from pipeline.cli import bench as _bench  # noqa: F401
from pipeline.cli import consume as _consume  # noqa: F401
from pipeline.cli import deploy as _deploy  # noqa: F401
from pipeline.cli import infer as _infer  # noqa: F401
from pipeline.cli import models as _models  # noqa: F401
from pipeline.cli import produce as _produce  # noqa: F401
from pipeline.cli import replay as _replay  # noqa: F401
from pipeline.cli import run as _run  # noqa: F401
from pipeline.cli import stack as _stack  # noqa: F401
from pipeline.cli import top as _top  # noqa: F401
from pipeline.cli import validate as _validate  # noqa: F401
from pipeline.cli.app import app, console_err
from pipeline.cli.connection import EndpointsFirst, drop_endpoints_line
from pipeline.errors import PipelineError


def main() -> None:
    """Run the CLI; user errors become one line on stderr and exit code 1."""
    stderr = sys.stderr
    sys.stderr = EndpointsFirst(stderr)
    try:
        app()  # standalone: click prints usage errors itself and exits 2
    except PipelineError as exc:
        drop_endpoints_line()  # the error alone: scripts read one line
        console_err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)  # `[audio]` is text
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        sys.stderr = stderr


__all__ = ["app", "main"]
