"""faust-streaming stays optional: ``pipeline.client`` neither needs nor loads it.

Each check runs in a fresh interpreter, since this one may already have imported faust.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCK_FAUST = """
import importlib.abc, sys

class NoFaust(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("faust", "mode") or name.startswith(("faust.", "mode.")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoFaust())
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_importing_the_client_does_not_import_faust() -> None:
    done = _python(
        "import sys, pipeline.client\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('faust', 'mode'))\n"
        "assert not loaded, loaded\n"
        "assert 'pipeline.client.faust' not in sys.modules\n"
    )
    assert done.returncode == 0, done.stderr


def test_without_faust_the_client_works_and_the_integration_names_its_extra() -> None:
    done = _python(
        BLOCK_FAUST
        + "from pipeline.client import Client, SyncClient\n"
        + "try:\n"
        + "    import pipeline.client.faust\n"
        + "except ImportError as exc:\n"
        + "    print(exc)\n"
        + "else:\n"
        + "    raise SystemExit('imported without faust')\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'streaming-inference-pipeline[faust]'" in done.stdout
