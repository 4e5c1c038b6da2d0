"""Test modules need unique basenames: tests/unit and tests/integration are not packages, so
pytest imports each module by its basename, and a second ``test_x.py`` stops the whole
collection ("import file mismatch"), which no single-file run shows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_unique_basename() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
