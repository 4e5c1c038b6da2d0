"""Triton's backends copied for this interpreter (pipeline/embedded/services.py): processes
starting Tritons at once share one complete copy and never remove one in use."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from pipeline.embedded.services import prepare_backends


def test_copies_made_at_once_end_as_one_complete_copy(tmp_path: Path) -> None:
    with ProcessPoolExecutor(4) as pool:
        copies = list(pool.map(prepare_backends, [tmp_path] * 4))
    assert len(set(copies)) == 1
    (copy,) = set(copies)
    assert (copy / ".source").is_file() and (copy / "python" / "triton_python_backend_stub").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [copy.name], "no staging folder left behind"
    assert prepare_backends(tmp_path) == copy  # found, not copied again
