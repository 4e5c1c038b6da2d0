"""The README is a front page of about 200 lines; the manual is docs/, built as a MkDocs site.

- ``mkdocs build --strict`` passes with no warning: every page under docs/ is in ``nav``,
  every link between pages resolves, anchors included (``validation`` in mkdocs.yml). Source
  files are named as inline code, never linked: the site holds docs/ only. Every code
  block is closed (Markdown would swallow the rest of the page without a word).
- README.md has at most 250 lines and opens, after its title and one intro line, with the
  two commands (install and run the audio topology; install with the test tools and test).
- Every section the README had before the manual moved to docs/ (its ``##`` and ``###``
  headings at that time, listed below) is still a heading of README.md or of a page under
  docs/, and the README links to that page; every relative link of the README resolves.
- The README's examples stay true: its topology is ``topologies/ensemble.yaml``, its
  ``pipeline validate --offline`` output is what the command prints, and its Python snippet
  imports only the public API.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

import pipeline
from pipeline import load_topology

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 250

OPENING_COMMANDS = [
    "./scripts/install.sh && .venv/bin/pipeline run topologies/audio.yaml",
    "./scripts/install.sh --test && .venv/bin/pytest",
]
"""The README's first commands, exactly (.ci/run runs the second)."""

OLD_README_SECTIONS = [
    # `##` headings of README.md before the split (git show a2610c7:README.md), in order
    "Streaming voice activity detection, end to end",
    "Ensembles across Kafka",
    "Length-aware batching",
    "Traffic splitting, shadowing and tasks",
    "Calling a topology from Python",
    "Priority lanes",
    "Installing with pip",
    "The embedded stack",
    "Pointing at real services",
    "Docker Compose",
    "Kubernetes",
    "The model store",
    "Measuring your topology: pipeline bench",
    "Benchmarks",
    "Large tensors: Triton system shared memory",
    "Reliability: every record reaches an outcome",
    "Tenant fairness",
    "Replaying dead letters",
    "Health, hangs and shutdown",
    "Several processes, a quiet console",
    "Metrics and alerts",
    "Watching a running topology: pipeline top",
    "Tracing",
    "Security",
    "Tests",
    "Layout",
    # and its `###` headings
    "Fused steps: one Triton ensemble instead of Kafka hops and joins",
    "From a Faust app",
    "How this scales",
]

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _headings(path: Path) -> list[str]:
    """The text of every ATX heading of a page, inline code marks removed."""
    found = []
    for line in _prose(path.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            found.append(m.group(1).replace("`", ""))
    return found


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```\s*$", text, re.S | re.M)]


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_the_site_builds_strictly_without_warnings(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert warnings == [], "mkdocs warned (a page missing from nav in mkdocs.yml, or a broken link):\n" + "\n".join(
        warnings
    )
    assert (tmp_path / "site" / "index.html").is_file()


def test_every_page_closes_its_code_blocks() -> None:
    """An unclosed fence swallows the rest of the page silently: Markdown does not warn."""
    unbalanced = [
        str(path.relative_to(REPO))
        for path in [README, *_pages()]
        if sum(1 for line in path.read_text().splitlines() if FENCE.match(line)) % 2
    ]
    assert unbalanced == [], f"an odd number of code fences (one left open) in {unbalanced}"


def test_the_readme_is_short_and_opens_with_the_two_commands() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"
    assert lines[0].startswith("# "), "README.md starts with its title"
    opening = next(i for i, line in enumerate(lines) if FENCE.match(line))
    intro = [line for line in lines[1:opening] if line.strip()]
    assert 1 <= len(intro) <= 3, f"between the title and the commands: a short intro only, not {intro}"
    assert not any(line.startswith("#") for line in intro), "no section before the two commands"
    info, body = _fenced_blocks("\n".join(lines[opening:]) + "\n")[0]
    assert info == "bash"
    commands = [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands == OPENING_COMMANDS
    comments = [line for line in body.splitlines() if line.lstrip().startswith("#")]
    assert len(comments) >= 2, "each command keeps its short comment"


def test_every_section_of_the_old_readme_is_still_found_from_the_readme() -> None:
    where: dict[str, list[Path]] = {heading: [] for heading in OLD_README_SECTIONS}
    for path in [README, *_pages()]:
        for heading in _headings(path):
            if heading in where:
                where[heading].append(path)
    missing = [heading for heading, paths in where.items() if not paths]
    assert missing == [], f"sections of the old README that are no heading of README.md or docs/*.md: {missing}"
    linked = {(README.parent / target.split("#")[0]).resolve() for target in LINK.findall(README.read_text())}
    unlinked = {
        heading: [str(p.relative_to(REPO)) for p in paths]
        for heading, paths in where.items()
        if README not in paths and not any(p.resolve() in linked for p in paths)
    }
    assert unlinked == {}, f"the README links to no page holding these sections: {unlinked}"


def test_every_relative_link_of_the_readme_resolves() -> None:
    broken = []
    for target in LINK.findall(README.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (README.parent / path).resolve() if path else README
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in {slugify(h, "-") for h in _headings(file)}:
            broken.append(f"{target}: no heading with that anchor in {file.relative_to(REPO)}")
    assert broken == []


def test_the_readme_topology_is_the_ensemble_file(tmp_path: Path) -> None:
    yaml_blocks = [body for info, body in _fenced_blocks(README.read_text()) if info == "yaml"]
    assert len(yaml_blocks) == 1, "the README shows one topology"
    copy = tmp_path / "ensemble.yaml"
    copy.write_text(yaml_blocks[0])
    environ: dict[str, str] = {}
    assert load_topology(copy, environ) == load_topology(REPO / "topologies" / "ensemble.yaml", environ)


def test_the_readme_validate_output_is_what_the_command_prints() -> None:
    shown = [body for info, body in _fenced_blocks(README.read_text()) if body.startswith("$ pipeline validate")]
    assert len(shown) == 1
    command, *expected = shown[0].rstrip("\n").splitlines()
    argv = command.removeprefix("$ pipeline ").split()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "pipeline"), *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n").splitlines() == expected


def test_the_readme_python_snippet_uses_the_public_api() -> None:
    snippets = [body for info, body in _fenced_blocks(README.read_text()) if info == "python"]
    assert len(snippets) == 1, "the README shows one Python snippet"
    imports = [
        node
        for node in ast.walk(ast.parse(snippets[0]))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pipeline"
    ]
    assert [node.module for node in imports] == ["pipeline"], "the README imports the public API only (from pipeline)"
    names = {alias.name for node in imports for alias in node.names}
    assert {"Client", "SyncClient", "InferResult", "load_topology", "Topology"} <= names
    assert names <= set(pipeline.__all__)
