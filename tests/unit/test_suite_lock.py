"""The lock that lets time-measuring tests run alone beside pytest-xdist's other process
(tests/helpers/exclusive.py). flock locks belong to open files, so threads holding their
own open files stand in for the processes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.helpers.exclusive import LOCK_DIR, suite_lock


def _hold(exclusive: bool, entered: list[str], name: str, release: threading.Event) -> threading.Thread:
    def run() -> None:
        with suite_lock(exclusive=exclusive):
            entered.append(name)
            release.wait(5)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _settle() -> None:
    time.sleep(0.2)  # the threads reach their lock calls (an order, not a measurement)


def test_an_exclusive_test_waits_for_the_one_beside_it_and_the_next_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOCK_DIR, str(tmp_path))
    entered: list[str] = []
    first, second, third = threading.Event(), threading.Event(), threading.Event()
    a = _hold(False, entered, "shared-a", first)
    _settle()
    b = _hold(True, entered, "exclusive", second)
    _settle()
    c = _hold(False, entered, "shared-c", third)  # arrives while the writer waits: queues behind it
    _settle()
    assert entered == ["shared-a"]
    first.set()
    a.join(5)
    _settle()
    assert entered == ["shared-a", "exclusive"], "the writer got in first, alone"
    second.set()
    b.join(5)
    _settle()
    assert entered == ["shared-a", "exclusive", "shared-c"]
    third.set()
    c.join(5)


def test_shared_tests_run_side_by_side_and_nothing_is_locked_without_xdist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOCK_DIR, str(tmp_path))
    entered: list[str] = []
    release = threading.Event()
    threads = [_hold(False, entered, name, release) for name in ("a", "b")]
    _settle()
    assert sorted(entered) == ["a", "b"]
    release.set()
    for thread in threads:
        thread.join(5)
    monkeypatch.delenv(LOCK_DIR)
    with suite_lock(exclusive=True), suite_lock(exclusive=True):
        pass  # no directory: no lock, so nesting cannot block
