"""`pipeline run`'s garbage-collector settings (pipeline/runtime/gc_tuning.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from pipeline.errors import ConfigError
from pipeline.runtime.gc_tuning import GC_ENV, YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_tuned_by_default_and_startup_objects_are_frozen(restore_gc: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GC_ENV, raising=False)
    assert tune_gc() is True
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    assert gc.get_freeze_count() > 0


def test_default_keeps_pythons_settings(restore_gc: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GC_ENV, "default")
    before = gc.get_threshold()
    assert tune_gc() is False
    assert gc.get_threshold() == before


def test_an_unknown_choice_is_a_one_line_error(restore_gc: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GC_ENV, "off")
    with pytest.raises(ConfigError, match="PIPELINE_GC='off'"):
        tune_gc()
