"""Scan and validate a local Triton model repository before anything is uploaded.

Triton reports a broken model only when it tries to load it, long after the
upload, and its message lands in the server log rather than in front of the
person who pushed. Checking the layout here, with one line naming the file at
fault, turns that into an immediate, local error.

A repository is a directory of model directories; each model directory holds
``config.pbtxt`` and numeric version directories::

    repo/
      dense_classifier/
        config.pbtxt
        1/model.py

Everything found here is uploaded to the bucket Triton loads code from, so two
things are refused before any byte leaves the machine: a symbolic link whose
target lies outside the folder being pushed (a link to ``~/.aws/credentials``
would otherwise be published), and a file larger than ``max_file_bytes``
(default :data:`DEFAULT_MAX_FILE_BYTES`; a stray dataset or core dump is almost
always a mistake, and an upload that size takes long enough to look like a hang).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from pydantic import ByteSize
from tritonclient.grpc import model_config_pb2

from pipeline.errors import ConfigError

CONFIG_FILE = "config.pbtxt"

DEFAULT_MAX_FILE_BYTES = 2 * 1024**3
"""Largest single file ``pipeline models push`` uploads unless told otherwise (2 GiB)."""

# Left behind by editors, Python and macOS; never part of a model.
_IGNORED_DIRS = frozenset({"__pycache__"})


@dataclass(frozen=True)
class LocalModel:
    """A validated model directory, ready to upload."""

    name: str
    path: Path
    config: model_config_pb2.ModelConfig
    versions: list[int]
    files: list[LocalFile] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Total bytes of all files, for progress bars and summaries."""
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class LocalFile:
    """One file of a model, addressed relative to the model directory (POSIX separators)."""

    relpath: str
    path: Path
    size: int


def scan_repository(
    path: Path | str,
    only: Iterable[str] | None = None,
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> list[LocalModel]:
    """Validate every model under ``path`` and return them sorted by name.

    ``path`` is either a repository (a directory of model directories) or a
    single model directory (it contains ``config.pbtxt``). ``only`` restricts
    the scan to the named models, so an unrelated broken model elsewhere in
    the repository does not block a push; naming a model that is not there
    is an error. No file may be larger than ``max_file_bytes``, and no symbolic
    link may lead out of its model directory (a linked model directory: out of
    the repository). The first problem found raises :class:`ConfigError`.
    """
    root = Path(path)
    if not root.exists():
        raise ConfigError(f"{root}: no such directory")
    if not root.is_dir():
        raise ConfigError(f"{root}: not a directory")
    if (root / CONFIG_FILE).exists():
        candidates = {root.name: root}
    else:
        candidates = {d.name: d for d in _subdirectories(root)}
    wanted = sorted(set(only)) if only else sorted(candidates)
    missing = [name for name in wanted if name not in candidates]
    if missing:
        raise ConfigError(f"{root}: no model directory named {', '.join(missing)}")
    if not wanted:
        raise ConfigError(f"{root}: no model directories (expected <model>/{CONFIG_FILE})")
    return [load_model_dir(candidates[name], max_file_bytes=max_file_bytes) for name in wanted]


def load_model_dir(model_dir: Path, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> LocalModel:
    """Validate one model directory: files (links and sizes), config, name, versions.

    Files come first: ``config.pbtxt`` itself may be a link out of the folder,
    and it must be refused before it is read (a parse error would quote it).
    """
    files = _model_files(model_dir, max_file_bytes)
    config = parse_config(model_dir)
    if config.name and config.name != model_dir.name:
        raise ConfigError(
            f'{model_dir / CONFIG_FILE}: name "{config.name}" does not match '
            f'the directory name "{model_dir.name}" (Triton requires them to be equal)'
        )
    versions = _version_dirs(model_dir)
    _check_version_policy(model_dir, config, versions)
    return LocalModel(
        name=model_dir.name,
        path=model_dir,
        config=config,
        versions=sorted(versions),
        files=files,
    )


def parse_config(model_dir: Path) -> model_config_pb2.ModelConfig:
    """Parse ``config.pbtxt`` into Triton's own ``ModelConfig`` message.

    Parsing with the server's schema catches misspelt fields and wrong types
    exactly as Triton would, and gives the line number.
    """
    config_path = model_dir / CONFIG_FILE
    if not config_path.is_file():
        raise ConfigError(f"{model_dir}: no {CONFIG_FILE}")
    try:
        text = config_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{config_path}: cannot read: {exc}") from None
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(_parse_error_line(config_path, exc)) from None
    return config


def _parse_error_line(config_path: Path, exc: text_format.ParseError) -> str:
    """``<path> line N: <reason>`` without protobuf's ``N:C : `` prefix."""
    message = re.sub(r"^\d+:\d+ : ", "", str(exc)).strip()
    line = exc.GetLine()
    where = f"{config_path} line {line}" if line else str(config_path)
    return f"{where}: {' '.join(message.split())}"


def _visible(directory: Path) -> list[Path]:
    """Entries of ``directory``, sorted, minus hidden ones and caches."""
    return sorted(
        e for e in directory.iterdir() if not e.name.startswith(".") and e.name not in _IGNORED_DIRS
    )


def _followed(entry: Path, inside: Path) -> Path:
    """``entry``, once checked: a symbolic link must resolve inside ``inside``, not to an ancestor.

    The walk follows links, so a link out of the folder would upload whatever it
    points at, and a link to a folder containing it would never end.
    """
    if not entry.is_symlink():
        return entry
    try:
        target = entry.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop of links (RuntimeError before 3.13)
        raise ConfigError(f"{entry}: symbolic link cannot be resolved (broken, or a loop)") from None
    if not target.is_relative_to(inside.resolve()):
        raise ConfigError(
            f"{entry}: symbolic link to {target} points outside {inside}; copy the file in instead"
        )
    if target.is_dir() and entry.parent.resolve().is_relative_to(target):
        raise ConfigError(f"{entry}: symbolic link to {target} contains itself (a loop)")
    return entry


def _subdirectories(root: Path) -> list[Path]:
    """Model candidates: visible directories (top-level files such as a README are skipped)."""
    return [_followed(d, root) for d in _visible(root) if d.is_dir()]


def _version_dirs(model_dir: Path) -> list[int]:
    """Numeric version directories; each must hold at least one file.

    An empty version directory cannot exist in S3 (there are no empty
    "directories" there) and Triton would fail to load it, so it is an error
    rather than something silently dropped.
    """
    versions: list[int] = []
    for entry in _subdirectories(model_dir):
        if not entry.name.isdigit():
            continue
        if not any(_walk_files(entry, model_dir)):
            raise ConfigError(f"{entry}: empty version directory")
        versions.append(int(entry.name))
    if not versions:
        raise ConfigError(
            f"{model_dir}: no version directory (expected a numeric directory such as "
            f"{model_dir / '1'} holding the model files)"
        )
    return versions


def _check_version_policy(
    model_dir: Path, config: model_config_pb2.ModelConfig, versions: list[int]
) -> None:
    """A ``version_policy { specific { versions: [...] } }`` must name existing directories."""
    if config.version_policy.WhichOneof("policy_choice") != "specific":
        return
    absent = sorted(set(config.version_policy.specific.versions) - set(versions))
    if absent:
        raise ConfigError(
            f"{model_dir / CONFIG_FILE}: version_policy names version(s) "
            f"{', '.join(map(str, absent))} but there is no such version directory"
        )


def _walk_files(directory: Path, model_dir: Path) -> Iterable[Path]:
    """Regular files below ``directory``, skipping hidden entries and ``__pycache__``.

    Links are followed only within ``model_dir``: the boundary is the model
    folder, not the subfolder the link sits in (``2/model.onnx -> ../1/model.onnx``
    shares weights between versions).
    """
    for entry in (_followed(e, model_dir) for e in _visible(directory)):
        if entry.is_dir():
            yield from _walk_files(entry, model_dir)
        elif entry.is_file():
            yield entry


def _model_files(model_dir: Path, max_file_bytes: int) -> list[LocalFile]:
    """Every file to upload, config and version directories alike, none over the size limit."""
    files = []
    for path in _walk_files(model_dir, model_dir):
        size = path.stat().st_size
        if size > max_file_bytes:
            raise ConfigError(
                f"{path}: {size} bytes is over the per-file limit of {max_file_bytes} bytes "
                f"({_binary_size(max_file_bytes)}; raise it with --max-file-size)"
            )
        files.append(LocalFile(relpath=path.relative_to(model_dir).as_posix(), path=path, size=size))
    return files


def _binary_size(n: int) -> str:
    """``2 GiB``, ``1.5 MiB``: the limit as a person sets it."""
    return ByteSize(n).human_readable()
