"""The package's layering, enforced: no import cycles, no module importing a higher layer.

Layers, lowest first: the message contract; plumbing (settings, Kafka, Triton, S3,
state, audio, observability, topology, failure policy); stages (``workers``); the
runtime and the clients; the CLI. A module may import its own layer or a lower one.
Imports under ``if TYPE_CHECKING:`` count too: they are still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LAYERS: list[tuple[str, ...]] = [
    ("pipeline.errors", "pipeline.contract"),
    (
        "pipeline.settings",
        "pipeline.extras",
        "pipeline.endpoints",
        "pipeline.processes",
        "pipeline.failure_policy",
        "pipeline.kafka",
        "pipeline.deadletter",
        "pipeline.triton",
        "pipeline.state",
        "pipeline.modelstore",
        "pipeline.audio",
        "pipeline.observability",
        "pipeline.embedded",
        "pipeline.topology",
        "pipeline.deadletter",
    ),
    ("workers",),
    ("pipeline.runtime", "pipeline.tools", "pipeline.client"),
    ("pipeline.cli", "pipeline.__main__", "pipeline"),
]


def _layer(module: str) -> int:
    best = (-1, -1)  # (prefix length, layer)
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), rank))
    assert best[1] >= 0, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def _modules() -> dict[str, Path]:
    found = {}
    for root in ("pipeline", "workers"):
        for path in (REPO / root).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Project modules ``module`` imports (``from a import b`` counts as ``a.b`` when that is a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out.update(n for n in names if n in known and n != module)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: _imports(p, m, known) for m, p in modules.items()}


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
        for m, deps in _graph().items()
        for d in sorted(deps)
        if _layer(d) > _layer(m)
    ]
    assert upward == []


WORKER_LAYERS = {
    "workers.runtime": set(),
    "workers.stateless": {"workers.runtime"},
    "workers.sequence": {"workers.runtime"},
    "workers.join": {"workers.runtime"},
}
"""Inside ``workers``: the runtime every stage shares, below three stage kinds that know
nothing of each other (the stateless stage with its optional features, the sequence stage,
the join)."""


def _worker_package(module: str) -> str | None:
    return next((p for p in WORKER_LAYERS if module == p or module.startswith(p + ".")), None)


def test_the_stage_kinds_share_only_the_runtime() -> None:
    modules = _graph()
    unplaced = [m for m in modules if m.startswith("workers.") and _worker_package(m) is None]
    assert unplaced == [], "a module of workers/ outside runtime/, stateless/, sequence/, join/"
    crossing = [
        f"{m} imports {d}"
        for m, deps in modules.items()
        if (own := _worker_package(m)) is not None
        for d in sorted(deps)
        if (other := _worker_package(d)) is not None and other != own and other not in WORKER_LAYERS[own]
    ]
    assert crossing == []


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components; package ``__init__`` re-exports excluded
    (importing ``a.b`` runs ``a/__init__`` first, which is not a dependency of ``a.b``'s code)."""
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in _graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []
