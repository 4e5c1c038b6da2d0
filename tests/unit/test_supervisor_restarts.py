"""The supervisor's restart rule (pipeline/runtime/supervisor.py), and the supervisor on real processes."""

from __future__ import annotations

import asyncio
import sys

from pipeline.runtime.supervisor import RestartPolicy, Supervisor


def test_delay_doubles_per_quick_failure_up_to_the_cap() -> None:
    policy = RestartPolicy(initial_delay_s=0.5, max_delay_s=4.0)
    assert [policy.delay_s(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_a_run_that_was_healthy_resets_the_count() -> None:
    policy = RestartPolicy(healthy_after_s=60.0)
    assert policy.quick_failures(3, ran_s=5.0) == 4
    assert policy.quick_failures(3, ran_s=120.0) == 1


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_gives_up_after_repeated_quick_failures_and_exits_1() -> None:
    policy = RestartPolicy(initial_delay_s=0.01, max_delay_s=0.01, max_quick_failures=2)
    supervisor = Supervisor(lambda _i: _python("raise SystemExit(3)"), 2, policy=policy)
    assert asyncio.run(supervisor.run()) == 1


def test_children_exiting_0_end_the_supervisor_with_0() -> None:
    supervisor = Supervisor(lambda i: _python(f"import time; time.sleep(0.1 * {i})"), 2)
    assert asyncio.run(supervisor.run()) == 0


def test_stop_forwards_sigterm_and_waits_for_the_children() -> None:
    # Each child exits 0 on SIGTERM, as `pipeline run` does after its drain.
    child = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(30)"

    async def scenario() -> int:
        supervisor = Supervisor(lambda _i: _python(child), 2, stop_timeout_s=10)
        running = asyncio.create_task(supervisor.run())
        await asyncio.sleep(1.0)
        supervisor.stop()
        return await asyncio.wait_for(running, 10)

    assert asyncio.run(scenario()) == 0
