"""Fixtures for the integration tests only (the session's services are in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.settings import S3Settings
from tests.helpers.own_triton import OwnTriton, start_own_triton


@pytest.fixture
def own_triton(s3_settings: S3Settings, cli_env: dict[str, str], tmp_path: Path) -> Iterator[OwnTriton]:
    """A Triton of the test's own (see :class:`OwnTriton`), stopped when the test ends."""
    with start_own_triton(s3_settings, cli_env, tmp_path / "triton") as triton:
        yield triton
