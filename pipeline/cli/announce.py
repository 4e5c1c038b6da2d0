"""What ``pipeline run`` tells a person: on the console in text mode, as log records in JSON mode.

Why: with ``--log-format json`` every line a log shipper reads must be one JSON
object, so the messages a person would see on the console (the startup summary,
the embedded stack's progress, "stopped cleanly") become records of the
``pipeline.cli`` logger instead of console prints.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from pipeline.cli.app import console
from pipeline.runtime.summary import StartupSummary

log = logging.getLogger("pipeline.cli")


class Announcer:
    def __init__(self, json: bool) -> None:
        self.json = json

    def say(self, text: str) -> None:
        if self.json:
            log.info(text)
        else:
            console.print(text, markup=False, highlight=False, soft_wrap=True)

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[Callable[[str], None]]:
        """A spinner line updated by the callback (text); one record per update (JSON)."""
        if self.json:
            log.info(text)
            yield log.info
            return
        with console.status(text) as status:
            yield lambda msg: status.update(msg)

    def summary(self, summary: StartupSummary, full: bool = True) -> None:
        """The block (``full``), else only its headline (the other processes of a supervisor)."""
        if self.json:
            log.info(summary.headline(), extra={"summary": summary.fields()})
            return
        for line in summary.lines() if full else [summary.headline()]:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
