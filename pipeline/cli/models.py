"""``pipeline models``: push, list, inspect, load and unload Triton models.

Models live in the S3 model store (MinIO in production) in Triton's
repository layout; Triton reads them from there (``--model-repository=s3://…``)
and, in explicit model-control mode, loads and unloads them on request.

Each command resolves only the endpoints it needs, so ``push`` works with
just S3 and ``inspect`` with just Triton. Heavy client libraries are imported
inside the commands to keep ``pipeline --help`` and unrelated commands quick.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from pipeline.cli.app import app, console, console_err
from pipeline.cli.connection import announce, connection_options, endpoints_text
from pipeline.cli.help import PipelineGroup
from pipeline.endpoints import resolve_endpoints
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pipeline.modelstore.repository import LocalModel
    from pipeline.modelstore.store import ModelStore, StoredModel
    from pipeline.settings import S3Settings, TritonSettings
    from pipeline.triton.admin import ModelDescription, RepositoryEntry, TritonAdmin

models_app = typer.Typer(
    name="models",
    help=(
        "Manage Triton models: push a local model repository to the S3 model store, "
        "list what is stored and loaded, inspect a model's inputs, outputs and batching, "
        "load and unload models on Triton (explicit model-control mode)."
    ),
    no_args_is_help=True,
    cls=PipelineGroup,
)
app.add_typer(models_app, name="models")


# --------------------------------------------------------------------------- helpers


def _store(settings: S3Settings) -> ModelStore:
    from pipeline.modelstore.store import ModelStore

    return ModelStore(settings)


def _admin(settings: TritonSettings) -> TritonAdmin:
    from pipeline.triton.admin import TritonAdmin

    return TritonAdmin(settings)


def human_size(n: int) -> str:
    """Bytes for people: ``2.2 MB``; binary prefixes would disagree with rich's progress bar."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def _byte_size(text: str) -> int:
    """``2GiB``, ``500MB`` or plain bytes, parsed by pydantic's ``ByteSize``; at least 1 byte."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    hint = "'--max-file-size' / PIPELINE_MODELS_MAX_FILE_SIZE"
    try:
        size = int(TypeAdapter(ByteSize).validate_python(text))
    except ValidationError:
        raise typer.BadParameter(f"{text!r} is not a size (e.g. 2147483648, 500MB, 2GiB)", param_hint=hint) from None
    if size < 1:
        raise typer.BadParameter("must be at least 1 byte", param_hint=hint)
    return size


def _versions_text(versions: list[int]) -> str:
    return ", ".join(map(str, versions)) or "-"


def _shape_text(shape: list[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _print_json(data: Any) -> None:
    """Plain JSON on stdout (no colour, no wrapping) so scripts can parse it."""
    typer.echo(json.dumps(data, indent=2))


# --------------------------------------------------------------------------- push


@models_app.command("push")
@connection_options(triton=True, s3=True)
def push(
    directory: Annotated[
        Path,
        typer.Argument(
            help="A Triton model repository (a directory of model directories) or one model "
            "directory (it contains config.pbtxt).",
            metavar="DIR",
            show_default=False,
        ),
    ],
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            "-m",
            help="Push only this model (repeat for several). Default: every model in DIR.",
            metavar="NAME",
            show_default=False,
        ),
    ] = None,
    load: Annotated[
        bool,
        typer.Option(
            "--load/--no-load",
            help="After uploading, ask Triton to load (or reload) each pushed model. "
            "Needs a Triton endpoint in explicit model-control mode.",
        ),
    ] = False,
    max_file_size: Annotated[
        str,
        typer.Option(
            "--max-file-size",
            help="Refuse any file larger than this: bytes, or a size such as 500MB or 8GiB.",
            envvar="PIPELINE_MODELS_MAX_FILE_SIZE",
            metavar="SIZE",
        ),
    ] = "2GiB",  # repository.DEFAULT_MAX_FILE_BYTES, as a person writes it
) -> None:
    """Validate models, upload them to the S3 model store, and optionally load them on Triton.

    Every model is validated first (config.pbtxt parses, its name matches the
    directory, version directories hold files, no file is over --max-file-size,
    no symbolic link points out of the folder); nothing is uploaded if one is
    invalid. A push replaces the stored copy: files gone locally are deleted.
    """
    from pipeline.modelstore.repository import scan_repository

    models = scan_repository(directory, only=model, max_file_bytes=_byte_size(max_file_size))
    endpoints = resolve_endpoints(need=("s3", "triton") if load else ("s3",))
    announce(endpoints_text(s3=endpoints.s3, triton=endpoints.triton if load else None))
    admin = _admin(endpoints.triton) if load else None
    if admin is not None:
        admin.ping()  # fail before uploading, not after
    store = _store(endpoints.s3)
    store.ensure_bucket()  # also proves S3 answers before a progress bar appears
    _upload(store, models)
    states = None
    if admin is not None:
        with admin:
            states = _load_all(admin, models)
    _print_push_summary(store, models, states)


def _upload(store: ModelStore, models: list[LocalModel]) -> None:
    """Upload with a byte progress bar on stderr (stdout stays for the summary).

    The bar is transient: once done (or failed) it gives way to the summary
    table or to the one-line error.
    """
    total = sum(m.size for m in models)
    columns = (
        TextColumn("[bold]uploading[/] {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    # Off when stderr is not a terminal (CI logs, pipes): a bar there is only noise.
    live = console_err.is_terminal
    with Progress(*columns, console=console_err, transient=True, disable=not live) as progress:
        task = progress.add_task(f"{len(models)} model(s) to {store.url}", total=total)
        store.push(models, lambda done, _total: progress.update(task, completed=done))


def _load_all(admin: TritonAdmin, models: list[LocalModel]) -> dict[str, str]:
    """Load each model; the first failure stops the command with Triton's reason."""
    states: dict[str, str] = {}
    for m in models:
        with console_err.status(f"loading {m.name} on Triton at {admin.url}"):
            admin.load(m.name)
        ready = [e.version for e in admin.model_states(m.name) if e.state == "READY"]
        states[m.name] = "; ".join(f"v{v} READY" for v in ready) or "not ready"
    return states


def _print_push_summary(
    store: ModelStore, models: list[LocalModel], states: dict[str, str] | None
) -> None:
    table = Table(title=f"pushed to {store.url}", title_justify="left")
    for column in ("model", "versions", "files", "size"):
        table.add_column(column, justify="right" if column in ("files", "size") else "left")
    if states is not None:
        table.add_column("triton")
    for m in models:
        row = [m.name, _versions_text(m.versions), str(len(m.files)), human_size(m.size)]
        table.add_row(*row, *([states[m.name]] if states is not None else []))
    console.print(table)


# --------------------------------------------------------------------------- list


@models_app.command("list")
@connection_options(triton=True, s3=True)
def list_models(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")
    ] = False,
) -> None:
    """List the models in the S3 model store with their state on Triton.

    Triton's column comes from its repository index (state per version, or why
    a model is unavailable). When Triton is not configured or does not answer,
    the store is still listed and one line says so.
    """
    endpoints = resolve_endpoints(need=("s3",))
    store = _store(endpoints.s3)
    stored = store.list_models()
    index, triton_error = _triton_index(endpoints.triton)
    line = endpoints_text(s3=endpoints.s3, triton=endpoints.triton)
    # One line on stderr either way: a missing Triton is part of where this command looked.
    announce(f"{line}; warning: {triton_error}" if triton_error else line)
    rows = _join(stored, index)
    if as_json:
        _print_json(
            {
                "store": {"endpoint": endpoints.s3.endpoint, "url": store.url},
                "triton": {"url": endpoints.triton.grpc_url, "error": triton_error},
                "models": rows,
            }
        )
        return
    _print_list_table(store, rows)


def _triton_index(settings: TritonSettings) -> tuple[list[RepositoryEntry] | None, str | None]:
    """Triton's repository index, or ``None`` and a one-line reason why there is none."""
    if not settings.configured:
        return (
            None,
            "no Triton endpoint configured (set PIPELINE_TRITON_GRPC_URL to show model states)",
        )
    try:
        with _admin(settings) as admin:
            return admin.repository_index(), None
    except PipelineError as exc:
        return None, f"{exc} (showing the store only)"


def _join(stored: list[StoredModel], index: list[RepositoryEntry] | None) -> list[dict[str, Any]]:
    """One row per model in the store or in Triton's index, with Triton's states attached."""
    by_name: dict[str, dict[str, Any]] = {
        s.name: {
            "name": s.name,
            "in_store": True,
            "versions": s.versions,
            "files": s.files,
            "size": s.size,
            "triton": [] if index is not None else None,
        }
        for s in stored
    }
    for entry in index or []:
        row = by_name.setdefault(
            entry.name,
            {
                "name": entry.name,
                "in_store": False,
                "versions": [],
                "files": 0,
                "size": 0,
                "triton": [],
            },
        )
        row["triton"].append(
            {"version": entry.version, "state": entry.state or "", "reason": entry.reason}
        )
    return [by_name[name] for name in sorted(by_name)]


def _triton_text(states: list[dict[str, str]] | None) -> str:
    """``v1 READY``; ``not loaded``; ``v1 UNAVAILABLE: <reason>``; ``unknown`` without Triton."""
    if states is None:
        return "unknown"
    if not states:
        return "not in Triton's repository"
    parts = []
    for s in states:
        state = s["state"] or "not loaded"
        if state == "UNAVAILABLE" and s["reason"] in ("", "unloaded"):
            state = "not loaded"
        text = f"v{s['version']} {state}" if s["version"] else state
        if s["reason"] and state != "not loaded":
            text += f": {s['reason']}"
        parts.append(text)
    return "; ".join(parts)


def _print_list_table(store: ModelStore, rows: list[dict[str, Any]]) -> None:
    table = Table(title=f"models in {store.url}", title_justify="left")
    table.add_column("model", no_wrap=True)
    table.add_column("versions")
    table.add_column("files", justify="right")
    table.add_column("size", justify="right")
    table.add_column("triton", overflow="fold")
    for row in rows:
        in_store = row["in_store"]
        table.add_row(
            row["name"],
            _versions_text(row["versions"]) if in_store else "(not in store)",
            str(row["files"]) if in_store else "-",
            human_size(row["size"]) if in_store else "-",
            _triton_text(row["triton"]),
        )
    if not rows:
        console.print(f"no models in {store.url}")
        return
    console.print(table)


# --------------------------------------------------------------------------- inspect


@models_app.command("inspect")
@connection_options(triton=True)
def inspect_model(
    name: Annotated[
        str, typer.Argument(help="Model name, as Triton knows it.", show_default=False)
    ],
    version: Annotated[
        str, typer.Option("--version", help="Model version; default: Triton's choice.")
    ] = "",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")
    ] = False,
) -> None:
    """Show a loaded model's inputs, outputs, batching and instances, as Triton serves it.

    Shapes: `shape` is per request item (the config's dims); `batched_shape`
    is what Triton's metadata reports, with -1 for the batch dimension when
    max_batch_size > 0. Built from Triton's model metadata and model config.
    """
    endpoints = resolve_endpoints(need=("triton",))
    announce(endpoints_text(triton=endpoints.triton))
    with _admin(endpoints.triton) as admin:
        description = admin.describe(name, version)
    if as_json:
        _print_json(description.to_dict())
    else:
        _print_description(description)


def _print_description(d: ModelDescription) -> None:
    backend = d.backend or d.platform or "?"
    console.print(
        f"[bold]{d.name}[/]  backend {backend}  versions {_versions_text(d.versions)}"
        f"  decoupled {'yes' if d.decoupled else 'no'}",
        highlight=False,
    )
    if d.batching:
        console.print(
            f"max_batch_size {d.max_batch_size} (requests carry a leading batch dimension; "
            "`shape` is per item)",
            highlight=False,
        )
    else:
        console.print("max_batch_size 0 (no batch dimension; shapes are exact)", highlight=False)
    for title, specs in (("inputs", d.inputs), ("outputs", d.outputs)):
        console.print(_tensor_table(title, specs))
    _print_batching(d)
    groups = Table(title="instance groups", title_justify="left")
    for column in ("name", "kind", "count", "gpus"):
        groups.add_column(column)
    for g in d.instance_groups:
        groups.add_row(g.name, g.kind, str(g.count), ", ".join(map(str, g.gpus)) or "-")
    console.print(groups)


def _tensor_table(title: str, specs: list[Any]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("name", "datatype", "shape", "batched_shape", "optional"):
        table.add_column(column, no_wrap=column != "name")
    for s in specs:
        table.add_row(
            s.name,
            s.datatype,
            _shape_text(s.shape),
            _shape_text(s.batched_shape),
            "yes" if s.optional else "no",
        )
    return table


def _print_batching(d: ModelDescription) -> None:
    db, sb = d.dynamic_batching, d.sequence_batching
    if db is None and sb is None:
        console.print("scheduling: default (no dynamic or sequence batching)")
    if db is not None:
        console.print(
            "dynamic_batching: preferred_batch_size "
            f"{_shape_text(db.preferred_batch_size)}, max_queue_delay_microseconds "
            f"{db.max_queue_delay_microseconds}, preserve_ordering "
            f"{'yes' if db.preserve_ordering else 'no'}",
            highlight=False,
        )
    if sb is None:
        return
    extra = (
        f", max_candidate_sequences {sb.max_candidate_sequences}, preferred_batch_size "
        f"{_shape_text(sb.preferred_batch_size)}"
        if sb.strategy == "oldest"
        else ""
    )
    console.print(
        f"sequence_batching: strategy {sb.strategy}, max_sequence_idle_microseconds "
        f"{sb.max_sequence_idle_microseconds}, max_queue_delay_microseconds "
        f"{sb.max_queue_delay_microseconds}{extra}",
        highlight=False,
    )
    controls = Table(title="sequence control inputs", title_justify="left")
    for column in ("name", "kind", "datatype"):
        controls.add_column(column)
    for c in sb.controls:
        controls.add_row(c.name, c.kind, c.datatype)
    console.print(controls)
    if sb.states:
        states = Table(title="sequence state", title_justify="left")
        for column in ("input_name", "output_name", "datatype", "shape"):
            states.add_column(column)
        for s in sb.states:
            states.add_row(s.input_name, s.output_name, s.datatype, _shape_text(s.shape))
        console.print(states)


# --------------------------------------------------------------------------- load / unload


@models_app.command("load")
@connection_options(triton=True)
def load(
    name: Annotated[
        str, typer.Argument(help="Model name in Triton's repository.", show_default=False)
    ],
) -> None:
    """Load (or reload) a model on Triton from its repository (explicit model-control mode)."""
    endpoints = resolve_endpoints(need=("triton",))
    announce(endpoints_text(triton=endpoints.triton))
    with _admin(endpoints.triton) as admin:
        with console_err.status(f"loading {name} on Triton at {admin.url}"):
            admin.load(name)
        ready = [e.version for e in admin.model_states(name) if e.state == "READY"]
    console.print(f"loaded {name} (READY: v{', v'.join(ready) or '-'})", highlight=False)


@models_app.command("unload")
@connection_options(triton=True)
def unload(
    name: Annotated[str, typer.Argument(help="A model Triton has loaded.", show_default=False)],
) -> None:
    """Unload a model from Triton; it stays in the model store and can be loaded again."""
    endpoints = resolve_endpoints(need=("triton",))
    announce(endpoints_text(triton=endpoints.triton))
    with _admin(endpoints.triton) as admin:
        admin.unload(name)
    console.print(f"unloaded {name}", highlight=False)
