"""The supervisor's restart rule (pipeline/runtime/supervisor.py), and the supervisor on real processes."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

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


def test_stop_forwards_sigterm_and_waits_for_the_children(tmp_path: Path) -> None:
    # Each child exits 0 on SIGTERM, as `pipeline run` does after its drain. It says when its
    # handler is in place: a SIGTERM before that (Python starting slowly on a busy machine,
    # CI of 2026-11-28) would kill it with the default action, which is not what is tested.
    ready = tmp_path / "ready"
    child = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
        "open(sys.argv[1], 'a').write('ready\\n'); time.sleep(30)"
    )

    async def scenario() -> int:
        supervisor = Supervisor(lambda _i: [*_python(child), str(ready)], 2, stop_timeout_s=10)
        running = asyncio.create_task(supervisor.run())
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text().count("ready") == 2):
            assert time.monotonic() < deadline, "children not started in 30 s"
            await asyncio.sleep(0.05)
        supervisor.stop()
        return await asyncio.wait_for(running, 10)

    assert asyncio.run(scenario()) == 0


_STANDBY_CHILD = """
import os, signal, sys, time
log = sys.argv[1]
if sys.argv[2] == "standby":
    line = sys.stdin.readline()  # as `pipeline run --standby`: told its index, or EOF
    if not line.strip():
        open(log, "a").write(f"standby-eof {os.getpid()}\\n")
        sys.exit(0)
    role, index = "standby", int(line)
else:
    role, index = "fresh", int(sys.argv[2])
open(log, "a").write(f"{role} {index} {os.getpid()}\\n")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
if index == 1 and not os.path.exists(log + ".crashed"):
    time.sleep(1.5)  # long enough for the standby to be up
    open(log + ".crashed", "w").close()
    os._exit(3)
time.sleep(30)
"""


def test_a_crashed_child_is_replaced_by_the_warm_standby_and_a_new_one_waits_behind_it(tmp_path: Path) -> None:
    log = tmp_path / "children.log"
    supervisor = Supervisor(
        lambda i: _python(_STANDBY_CHILD) + [str(log), str(i)], 2,
        policy=RestartPolicy(initial_delay_s=0.01), standby_argv=_python(_STANDBY_CHILD) + [str(log), "standby"],
    )  # fmt: skip

    async def scenario() -> int:
        running = asyncio.create_task(supervisor.run())
        for _ in range(200):
            if log.exists() and "standby 1 " in log.read_text():
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the standby behind it starts
        supervisor.stop()
        return await running

    assert asyncio.run(scenario()) == 0
    roles = [line.split()[:-1] for line in log.read_text().splitlines()]  # without the pid
    assert sorted(r for r in roles if r[0] == "fresh") == [["fresh", "0"], ["fresh", "1"]], roles
    assert ["standby", "1"] in roles, "the crashed child 2 was replaced by the standby, not a fresh start"
    assert roles[-1] == ["standby-eof"], "the standby behind it exited on the stop, serving nothing"
