"""The suite's module order (tests/helpers/module_order.py): longest first, exclusive modules
last, every test kept and each module's tests in their own order."""

from __future__ import annotations

from dataclasses import dataclass

from tests.helpers.module_order import module_order


@dataclass
class FakeItem:
    nodeid: str
    exclusive: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return "exclusive" if name == "exclusive" and self.exclusive else None


def test_longest_modules_lead_and_all_exclusive_modules_trail() -> None:
    items = [
        FakeItem("tests/integration/test_hangs.py::a", exclusive=True),
        FakeItem("tests/unit/test_small.py::a"),
        FakeItem("tests/integration/test_triton_faults.py::a"),
        FakeItem("tests/integration/test_triton_faults.py::b", exclusive=True),  # one exclusive test: not last
        FakeItem("tests/unit/test_small.py::b"),
        FakeItem("tests/integration/test_backlog.py::a"),
        FakeItem("tests/integration/test_hangs.py::b", exclusive=True),
    ]
    ordered = module_order(items)
    assert [i.nodeid for i in ordered] == [
        "tests/integration/test_backlog.py::a",
        "tests/integration/test_triton_faults.py::a",
        "tests/integration/test_triton_faults.py::b",
        "tests/unit/test_small.py::a",
        "tests/unit/test_small.py::b",
        "tests/integration/test_hangs.py::a",
        "tests/integration/test_hangs.py::b",
    ]
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in items)
