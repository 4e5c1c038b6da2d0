"""How `pipeline run` sets Python's cyclic garbage collector: young objects collected
50,000 allocations apart instead of 700, and what start-up loaded never scanned again.

Why: a stage allocates a few container objects per record (its slot, its request, the
tuples and dicts of its result), nearly all freed by reference counting the moment they
are done; the cyclic collector only has to find cycles (an exception's traceback, a
finished task's callbacks). At Python's default thresholds it ran about once per 21
requests and its older generations walked every live object: every module, the topology,
the clients, and the records the outbox holds. Measured with the in-memory stage
(``tests/helpers/stage_harness.py``, 19,800 requests, 2026-11-28): 942 young, 85 middle
and 7 full collections took 516-526 ms, 26 µs per request of a 65-67 µs total; with these
settings 8 young collections took 83-88 ms (4 µs per request), 46-55 µs total. The same
comparison end to end is ``benchmarks.stateless`` case (g) against (d).

Cycles still get collected, later: memory held by garbage cycles is bounded by what
50,000 allocations can leave behind. ``PIPELINE_GC=default`` keeps Python's settings
(debugging a leak, or comparing).
"""

from __future__ import annotations

import gc
import os

from pipeline.errors import ConfigError

GC_ENV = "PIPELINE_GC"
YOUNG_THRESHOLD = 50_000  # allocations less deallocations between young collections (Python: 700)
MIDDLE_THRESHOLD = 20  # young collections per middle one (Python: 10)
OLD_THRESHOLD = 100  # middle collections per full one (Python: 10; 3.11 also waits for 25 % growth)


def tune_gc() -> bool:
    """Apply the stage's collector settings unless ``PIPELINE_GC=default``; whether it did.
    Called once start-up has imported what a stage needs, so :func:`gc.freeze` moves all
    of it out of every future collection's way."""
    choice = os.environ.get(GC_ENV, "tuned").strip().lower()
    if choice == "default":
        return False
    if choice != "tuned":
        raise ConfigError(f"{GC_ENV}={choice!r}: expected 'tuned' or 'default'")
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
    return True
