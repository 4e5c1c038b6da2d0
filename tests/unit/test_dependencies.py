"""Declared dependencies and imports agree: nothing works only by accident, nothing is carried for nothing.

- Every third-party module imported anywhere in ``pipeline/`` or ``workers/`` (lazy imports
  included) belongs to a distribution declared in ``[project] dependencies`` or in the
  ``embedded`` extra (the local stack ``pipeline run`` starts by default), or, in the
  modules of a feature behind an extra (``audio``: DALI, ``plot``: matplotlib, ``faust``),
  to that extra. aiohttp, for one, used to arrive only because faust-streaming depends on it.
- Every distribution in ``[project] dependencies`` is imported somewhere there: a runtime
  dependency has a run-time role (a benchmark's library belongs in an extra).
- The core stays lean: no ``nvidia-*`` distribution and no matplotlib in ``[project]
  dependencies``, and ``import pipeline, pipeline.client, pipeline.cli`` loads neither DALI
  nor matplotlib (their modules import them inside functions only).

Import names map to distributions through ``importlib.metadata.packages_distributions()``;
namespace packages shared by several distributions (``google``, ``nvidia``,
``opentelemetry``) are told apart by the files each distribution installed.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

import tomllib  # Python 3.11+, what CI runs: on an older Python this test fails, it never skips

REPO = Path(__file__).resolve().parents[2]
OURS = ("pipeline", "workers", "tests", "benchmarks")
RUNTIME_EXTRAS = ("embedded",)
LOADED_BY_ENTRY_POINT = {
    "opentelemetry-exporter-otlp-proto-grpc": "opentelemetry_traces_exporter",
}
"""Runtime dependencies nothing imports by name: pipeline/observability/tracing.py loads them
from this entry-point group, as OpenTelemetry's own auto-configuration does."""
OPTIONAL_INTEGRATIONS = {"pipeline/client/faust.py": "faust"}
"""Modules that may import their extra's distributions too: an integration with a framework
the user installs (``pip install ...[faust]``); nothing else in the package imports them."""
OPTIONAL_FEATURES = {
    "pipeline/audio/dali_preprocess.py": "audio",
    "pipeline/audio/device.py": "audio",
    "pipeline/tools/bench/plot.py": "plot",
}
"""Modules of a feature behind an extra (the DALI stage, ``pipeline bench --plot``): they may
import their extra's distributions, inside functions only (checked below), so that importing
them, as the CLI and the stage builders do, never needs the extra."""
LEAN_CORE_EXCLUDES = ("nvidia-", "matplotlib")
"""Prefixes of distributions that must never be core dependencies (hundreds of MB, one feature each)."""
TEST_ONLY_MODULES = {"pipeline/audio/reference.py": "the tests' and benchmarks' numpy/scipy reference of DALI"}
"""Modules of the package that nothing in ``pipeline/`` or ``workers/`` imports (checked below)."""


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(spec: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", spec.strip())
    assert match, spec
    return _normalise(match.group(0))


def _project() -> dict[str, object]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert isinstance(project, dict)
    return project


def _core() -> set[str]:
    return {_requirement_name(spec) for spec in _project()["dependencies"]}  # type: ignore[attr-defined]


def _extra(name: str) -> set[str]:
    extras = _project()["optional-dependencies"]
    assert isinstance(extras, dict)
    return {_requirement_name(spec) for spec in extras[name]}


def _runtime_allowed(importer: str | None = None) -> set[str]:
    """What ``importer`` may import: the core and runtime extras, plus its own extra."""
    allowed = _core().union(*(_extra(extra) for extra in RUNTIME_EXTRAS))
    if importer in OPTIONAL_INTEGRATIONS:
        allowed |= _extra(OPTIONAL_INTEGRATIONS[importer])
    if importer in OPTIONAL_FEATURES:
        allowed |= _extra(OPTIONAL_FEATURES[importer])
    return allowed


def _source_files() -> list[Path]:
    return [p for root in ("pipeline", "workers") for p in sorted((REPO / root).rglob("*.py"))]


def _imported_names(path: Path) -> set[str]:
    """Dotted names imported by ``path`` (absolute imports; ``from a import b`` gives ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _eagerly_imported_names(path: Path) -> set[str]:
    """Like :func:`_imported_names`, but only what runs when the module is imported: imports in
    its body (``if``/``try`` blocks included), not in functions or ``if TYPE_CHECKING:``."""
    names: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(ast.parse(path.read_text()).body)
    return names


def _third_party(name: str) -> bool:
    top = name.split(".")[0]
    return top not in sys.stdlib_module_names and top not in OURS and top != "__future__"


@cache
def _packages() -> dict[str, list[str]]:
    return metadata.packages_distributions()


@cache
def _files(distribution: str) -> tuple[str, ...]:
    return tuple(str(f) for f in metadata.files(distribution) or ())


def distributions_of(name: str) -> set[str]:
    """The distributions that install the module ``name`` (its deepest part one of them owns)."""
    candidates = _packages().get(name.split(".")[0], [])
    if len(set(candidates)) <= 1:
        return {_normalise(c) for c in candidates}
    parts = name.split(".")
    while parts:
        path = "/".join(parts)
        owners = {c for c in candidates if any(f.startswith(path + "/") or f == path + ".py" for f in _files(c))}
        if owners:
            return {_normalise(c) for c in owners}
        parts.pop()
    return {_normalise(c) for c in candidates}


def _runtime_imports() -> dict[str, set[str]]:
    """Third-party module name -> the files importing it (test-only modules left out)."""
    found: dict[str, set[str]] = {}
    for path in _source_files():
        rel = str(path.relative_to(REPO))
        if rel in TEST_ONLY_MODULES:
            continue
        for name in _imported_names(path):
            if _third_party(name):
                found.setdefault(name, set()).add(rel)
    return found


def test_every_runtime_import_is_a_declared_dependency() -> None:
    undeclared = {
        name: (sorted(distributions_of(name)), sorted(outside))
        for name, files in _runtime_imports().items()
        if (outside := [f for f in files if not distributions_of(name) & _runtime_allowed(f)])
    }
    assert undeclared == {}, f"imported but not declared in pyproject.toml (name: (distributions, files)): {undeclared}"


def test_every_declared_runtime_dependency_is_imported() -> None:
    imported = set().union(*(distributions_of(name) for name in _runtime_imports()))
    for distribution, group in LOADED_BY_ENTRY_POINT.items():
        names = [e.name for e in metadata.distribution(distribution).entry_points if e.group == group]
        assert names, f"{distribution} offers no {group} entry point"
        imported.add(distribution)
    unused = sorted(_core() - imported)
    assert unused == [], f"declared in [project] dependencies, imported nowhere in pipeline/ or workers/: {unused}"


def test_test_only_modules_are_not_imported_at_run_time() -> None:
    test_only = {rel.removesuffix(".py").replace("/", ".") for rel in TEST_ONLY_MODULES}
    importers = {
        str(path.relative_to(REPO)): sorted(names & test_only)
        for path in _source_files()
        if (names := {n for name in _imported_names(path) for n in (name, name.rpartition(".")[0])}) & test_only
    }
    assert importers == {}, importers


def test_optional_integrations_import_their_extra_and_nothing_imports_them() -> None:
    """An integration's framework stays optional: its extra exists and declares what the
    module imports, and no other module of the package imports the integration."""
    for rel, extra in OPTIONAL_INTEGRATIONS.items():
        assert (REPO / rel).is_file(), rel
        frameworks = {d for name in _imported_names(REPO / rel) if _third_party(name) for d in distributions_of(name)}
        assert frameworks & _extra(extra), f"{rel} imports nothing from the {extra!r} extra"
    integrations = {rel.removesuffix(".py").replace("/", ".") for rel in OPTIONAL_INTEGRATIONS}
    importers = {
        str(path.relative_to(REPO)): sorted(names & integrations)
        for path in _source_files()
        if (names := {n for name in _imported_names(path) for n in (name, name.rpartition(".")[0])}) & integrations
    }
    assert importers == {}, importers


def test_optional_features_import_their_extra_lazily() -> None:
    """A feature's module imports its extra's distributions, and only inside functions."""
    for rel, extra in OPTIONAL_FEATURES.items():
        assert (REPO / rel).is_file(), rel
        lazily = {d for name in _imported_names(REPO / rel) if _third_party(name) for d in distributions_of(name)}
        assert lazily & _extra(extra), f"{rel} imports nothing from the {extra!r} extra"
        eagerly = {d for name in _eagerly_imported_names(REPO / rel) if _third_party(name) for d in distributions_of(name)}
        assert not eagerly & _extra(extra), f"{rel} imports {sorted(eagerly & _extra(extra))} when imported"


def test_extras_of_the_layout() -> None:
    """DALI and matplotlib are extras of their own; numpy's <2 cap lives with the embedded stack only."""
    assert "nvidia-dali-cuda120" in _extra("audio")
    assert "matplotlib" in _extra("plot")
    groups = {"core": _project()["dependencies"], **_project()["optional-dependencies"]}  # type: ignore[dict-item]
    numpy = {group: spec for group, specs in groups.items() for spec in specs if _requirement_name(spec) == "numpy"}
    assert "<2" not in numpy["core"], f"the core must accept numpy 2: {numpy}"
    assert "<2" in numpy["embedded"], f"nvidia-pytriton needs numpy<2, stated in the embedded extra: {numpy}"


def test_the_core_has_no_nvidia_package_and_no_matplotlib() -> None:
    heavy = sorted(d for d in _core() if d.startswith(LEAN_CORE_EXCLUDES))
    assert heavy == [], f"core dependencies that belong in an extra: {heavy}"


def test_importing_the_package_client_and_cli_loads_neither_dali_nor_matplotlib() -> None:
    # A fresh interpreter: this one may have imported either already.
    code = (
        "import sys, pipeline, pipeline.client, pipeline.cli\n"
        "print(sorted(m for m in sys.modules if m == 'nvidia.dali' or m.startswith(('nvidia.dali.', 'matplotlib'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
