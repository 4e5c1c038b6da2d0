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
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from pipeline.errors import ConfigError

CONFIG_FILE = "config.pbtxt"

# Left behind by editors, Python and macOS; never part of a model.
_IGNORED_DIRS = frozenset({"__pycache__"})


@dataclass(frozen=True)
class LocalFile:
    """One file of a model, addressed relative to the model directory (POSIX separators)."""

    relpath: str
    path: Path
    size: int


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


def scan_repository(path: Path | str, only: Iterable[str] | None = None) -> list[LocalModel]:
    """Validate every model under ``path`` and return them sorted by name.

    ``path`` is either a repository (a directory of model directories) or a
    single model directory (it contains ``config.pbtxt``). ``only`` restricts
    the scan to the named models, so an unrelated broken model elsewhere in
    the repository does not block a push; naming a model that is not there
    is an error. The first problem found raises :class:`ConfigError`.
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
    return [load_model_dir(candidates[name]) for name in wanted]


def load_model_dir(model_dir: Path) -> LocalModel:
    """Validate one model directory: config, name, version directories, files."""
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
        files=_model_files(model_dir),
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


def _subdirectories(root: Path) -> list[Path]:
    """Model candidates: visible directories (top-level files such as a README are skipped)."""
    return sorted(
        d
        for d in root.iterdir()
        if d.is_dir() and not d.name.startswith(".") and d.name not in _IGNORED_DIRS
    )


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
        if not any(_walk_files(entry)):
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


def _walk_files(directory: Path) -> Iterable[Path]:
    """Regular files below ``directory``, skipping hidden entries and ``__pycache__``."""
    for entry in sorted(directory.iterdir()):
        if entry.name.startswith(".") or entry.name in _IGNORED_DIRS:
            continue
        if entry.is_dir():
            yield from _walk_files(entry)
        elif entry.is_file():
            yield entry


def _model_files(model_dir: Path) -> list[LocalFile]:
    """Every file to upload, config and version directories alike."""
    return [
        LocalFile(relpath=f.relative_to(model_dir).as_posix(), path=f, size=f.stat().st_size)
        for f in _walk_files(model_dir)
    ]
