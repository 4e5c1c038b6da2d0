"""The order the suite's modules start in, so that the two test processes finish together.

pytest-xdist (``--dist loadfile``) gives each process a whole module at a time. By default it
hands out the modules with the most tests first, which left the one-test backlog module
(269 s) to start last and run alone while the other process idled (ci21: one process busy
1,376 s, the other 1,903 s, in a run of 2,136 s). The suite runs with
``--no-loadscope-reorder`` and this order instead (tests/conftest.py):

1. the longest modules first, longest-running first (seconds of a full run, ci21), so that
   short ones fill in at the end. ``test_backlog.py`` leads: its one test holds its process
   longest, and ``test_triton_faults.py`` (third) has an ``exclusive`` test that must not
   wait for it;
2. every other module that has a test beside others, in collection order;
3. last, the modules whose every test is ``exclusive`` (tests/helpers/exclusive.py): each such
   test waits for the test beside it to end, so they come when only short tests are left, and
   then run one after another.

Only the order changes, never which tests run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

LONGEST_FIRST = (
    "test_backlog.py",  # 269 s, one test
    "test_hostile_inputs.py",  # 239 s
    "test_triton_faults.py",  # 337 s
    "test_sequence_stage.py",  # 286 s
    "test_exactly_once.py",  # 138-215 s, one test (three topologies side by side)
    "test_model_lifecycle.py",  # 169 s
    "test_produce_consume.py",  # 131 s
    "test_stateless_stage.py",  # 116 s
    "test_triton_fleet.py",  # 84 s
    "test_apache_kafka.py",  # 80 s
    "test_embedded_stack.py",  # 71 s
    "test_ensemble.py",  # 67 s
    "test_models_cli.py",  # 66 s
    "test_replay.py",  # 66 s
    "test_bench_cli.py",  # 49 s
    "test_no_credential_leaks.py",  # 49 s
    "test_audio_topology.py",  # 42 s
    "test_kafka_tls.py",  # 40 s
    "test_processes.py",  # 40 s
)


class Item(Protocol):
    nodeid: str

    def get_closest_marker(self, name: str) -> object | None: ...


def module_order(items: Sequence[Item]) -> list[Item]:
    """``items`` regrouped module by module in the order above; each module's own tests keep
    their order."""
    modules: dict[str, list[Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def rank(path: str) -> tuple[int, int]:
        name = path.rsplit("/", 1)[-1]
        if name in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(name)
        if all(item.get_closest_marker("exclusive") is not None for item in modules[path]):
            return 2, 0
        return 1, 0

    ordered = sorted(modules, key=rank)  # stable: collection order within a rank
    return [item for path in ordered for item in modules[path]]
