"""When an open join window may close before every branch arrived, and which rule let it.

A window is closed for its *missing* branches only (what arrived is no reason to wait):
each must be proven unable to deliver. Per missing branch, on the window's partition:

- ``gone``: a group feeding it has had no live member for ``branch_gone_after``;
- ``caught-up``: its stages have processed all their input and the join has read the
  branch to its end (event time "now" has passed the window's end);
- ``event-time``: its stages are behind, but the oldest record they have left to finish is
  stamped past the window's end, plus a grace for out-of-order stamps (their position:
  :mod:`pipeline.kafka.progress`, :mod:`workers.runtime.event_time`);

and, for the whole window, ``max-wait``: it has been open longer than the hard limit.
Time since a commit is none of these (issue 28). Gone and caught-up still wait until the
join has read what the branch already wrote, so an output produced before its stage went
away is joined, not expired.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pipeline.kafka.progress import BranchState

Rule = Literal["caught-up", "event-time", "gone", "max-wait", "evicted"]

Judged = tuple[int, BranchState, bool]
Judge = Callable[[str], Judged]
"""missing branch -> (its partition's watermark, its upstream's state, read and caught up)."""


def expiry_rules(
    *,
    first_ms: int,
    opened_ms: int,
    missing: Sequence[str],
    window_ms: float,
    max_wait_ms: float | None,
    now_ms: int,
    judge: Judge,
) -> dict[str, Rule] | None:
    """The rule that closes the window for each missing branch, or None while any may still come."""
    if max_wait_ms is not None and now_ms - opened_ms >= max_wait_ms:
        return dict.fromkeys(missing, "max-wait")
    rules: dict[str, Rule] = {}
    for branch in missing:
        mark, state, caught_up = judge(branch)
        if mark - first_ms < window_ms:
            return None
        rules[branch] = "gone" if state is BranchState.GONE else "caught-up" if caught_up else "event-time"
    return rules


def expiry_reason(
    rules: dict[str, Rule] | None,
    *,
    window_ms: float,
    missing: Sequence[str],
    have: Sequence[str],
    gone_after_s: float,
    max_wait_s: float | None,
) -> str:
    """The dead letter's reason: the window, what is missing, and the rule per missing branch."""
    texts: dict[Rule, str] = {
        "caught-up": "caught-up (its stages processed all their input, nothing came)",
        "event-time": "event-time (its stages' position moved past the window's end)",
        "gone": f"gone (its group had no live member for {gone_after_s:g} s)",
        "max-wait": f"max-wait (open {max_wait_s or 0:g} s)",
        "evicted": "evicted (max_open_joins)",
    }
    why = "; ".join(f"{branch} {texts[rule]}" for branch, rule in (rules or dict.fromkeys(missing, "evicted")).items())
    head = f"join window of {window_ms:.0f} ms expired; missing {', '.join(missing)} (have {', '.join(have)})"
    return f"{head}; rule: {why}"
