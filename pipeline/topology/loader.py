"""Read a topology file: YAML, ``${VAR}`` interpolation, validation, located errors.

Whatever is wrong with a file, the person who wrote it gets *one line* that
names the file, the line and the key, e.g.::

    topologies/x.yaml:12: stages[0].batching.max_queue_delay_ms: Input should be a valid number

To get there, :class:`TopologyLoader` composes the YAML node graph first and
walks it once before constructing Python objects: the walk interpolates
environment variables, rejects duplicate keys (PyYAML silently keeps the
last one) and records the start mark of every mapping key and sequence item
under its key path. A pydantic error's ``loc`` is then mapped back onto that
index.

Interpolation works on the *text* of scalar values, before YAML decides
their type: ``partitions: ${PARTITIONS:-4}`` is the integer 4, exactly as if
``4`` had been typed there, while a quoted ``"${VERSION}"`` stays a string.
Mapping keys are never interpolated; ``$${`` writes a literal ``${``. Inside
a flow collection (``{a: ${X}}``) YAML reads ``{`` as syntax, so a reference
must be quoted there or written in block style.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from pipeline.errors import ConfigError
from pipeline.topology.model import Topology

KeyPath = tuple[str | int, ...]

#: Names a topology may not interpolate: a value read into a topic or model name would be
#: created, logged and printed, so a topology file could copy a worker's secret out.
_CREDENTIAL_NAME = re.compile(r"SECRET|PASSW|TOKEN|CREDENTIAL|(PRIVATE|ACCESS|API)_KEY", re.IGNORECASE)

_REFERENCE = re.compile(
    r"\$\$\{"  # escaped: a literal "${"
    r"|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|\$\{"  # any other "${" is malformed
)
_STR_TAG = "tag:yaml.org,2002:str"
MAX_EXPANDED_NODES = 100_000
"""Values a topology may hold once its aliases are expanded (real ones hold hundreds)."""
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Located(Exception):
    """A problem found while reading the YAML, before the file name is known to the message."""

    def __init__(self, mark: yaml.Mark | None, path: KeyPath, message: str) -> None:
        super().__init__(message)
        self.mark = mark
        self.path = path
        self.message = message


def format_path(path: KeyPath) -> str:
    """``("stages", 0, "batching")`` -> ``stages[0].batching``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


class TopologyLoader(yaml.SafeLoader):
    """A safe YAML loader that interpolates ``${VAR}`` and remembers where every key is.

    After :meth:`load_document`, :attr:`key_marks` maps the key path of every
    mapping key and sequence item (and ``()`` for the document) to its
    start mark.
    """

    def __init__(self, stream: str, environ: Mapping[str, str]) -> None:
        super().__init__(stream)
        self.environ = environ
        self.key_marks: dict[KeyPath, yaml.Mark] = {}
        self._interpolated: set[int] = set()
        self._visits = 0

    def load_document(self) -> Any:
        """Compose, index and construct the single document (None for an empty file)."""
        try:
            node = self.get_single_node()
            if node is None:
                return None
            self.key_marks[()] = node.start_mark
            self._index(node, (), frozenset())
            return self.construct_document(node)
        finally:
            self.dispose()

    # -- the walk -----------------------------------------------------------

    def _index(self, node: yaml.Node, path: KeyPath, ancestors: frozenset[int]) -> None:
        if id(node) in ancestors:  # a recursive alias (`&a [*a]`): indexed once is enough
            return
        self._visits += 1
        if self._visits > MAX_EXPANDED_NODES:
            # Aliases of aliases expand exponentially ("billion laughs"): refuse, don't hang.
            raise _Located(
                node.start_mark, path, f"the document expands to more than {MAX_EXPANDED_NODES:,} values (alias nesting)"
            )
        ancestors = ancestors | {id(node)}
        if isinstance(node, yaml.ScalarNode):
            self._interpolate(node, path)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.key_marks.setdefault((*path, index), item.start_mark)
                self._index(item, (*path, index), ancestors)
        elif isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Mark] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG:  # `<<: *base` merges into this mapping
                    self._index(value_node, path, ancestors)
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable (complex) key; construction rejects it
                    continue
                if first is not key_node.start_mark:
                    raise _Located(
                        key_node.start_mark,
                        (*path, key),
                        f"duplicate key (first at line {first.line + 1})",
                    )
                self.key_marks.setdefault((*path, key), key_node.start_mark)
                self._index(value_node, (*path, key), ancestors)

    def _interpolate(self, node: yaml.ScalarNode, path: KeyPath) -> None:
        if "$" not in node.value or id(node) in self._interpolated:
            return
        self._interpolated.add(id(node))  # an aliased node is reached twice; `$${` must not be

        def substitute(match: re.Match[str]) -> str:
            if match.group(0) == "$${":
                return "${"
            name = match.group("name")
            if name is None:
                raise _Located(
                    node.start_mark,
                    path,
                    "malformed variable reference: use ${NAME}, ${NAME:-default} or $${ for "
                    "a literal ${",
                )
            if _CREDENTIAL_NAME.search(name):
                raise _Located(
                    node.start_mark,
                    path,
                    f"environment variable {name} looks like a credential: a topology may not read "
                    "credentials (they are settings from the environment only, see docs/security.md)",
                )
            value = self.environ.get(name)
            default = match.group("default")
            if default is not None and not value:  # `:-` as in the shell: unset or empty
                return default
            if value is None:
                raise _Located(
                    node.start_mark,
                    path,
                    f"environment variable {name} is not set (write ${{{name}:-default}} "
                    "to give it a default)",
                )
            return value

        original = node.value
        node.value = _REFERENCE.sub(substitute, original)
        if node.style is None and node.tag == _STR_TAG:
            # A plain scalar: type the substituted text as YAML would have typed it.
            node.tag = self.resolve(yaml.ScalarNode, node.value, (True, False))  # type: ignore[no-untyped-call]


# --------------------------------------------------------------------------- errors


def _key_path(loc: tuple[str | int, ...], data: Any) -> KeyPath:
    """Turn a pydantic ``loc`` into a key path of the file.

    ``loc`` also holds names that are not keys: the tag of a discriminated
    union member (``stages.0.stateless.model``) or a union member's type.
    Follow ``loc`` through the data and drop what is not there, except a
    trailing key of a mapping (a missing required key).
    """
    path: list[str | int] = []
    current = data
    for position, part in enumerate(loc):
        in_mapping = isinstance(current, dict) and part in current
        in_sequence = (
            isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current)
        )
        if in_mapping or in_sequence:
            current = current[part]
        elif not (isinstance(current, dict) and position == len(loc) - 1):
            continue
        path.append(part)
    return tuple(path)


def _unwrap(annotation: Any) -> list[Any]:
    """The classes an annotation may hold: ``Annotated``, ``Optional`` and unions removed."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [c for arg in typing.get_args(annotation) for c in _unwrap(arg)]
    return [annotation]


def _keys_at(path: KeyPath, data: Any) -> list[str]:
    """The keys the model accepts at ``path`` (for "did you mean"); [] when unknown."""
    candidates: list[Any] = [Topology]
    current = data
    for part in path:
        following: list[Any] = []
        for candidate in candidates:
            origin = typing.get_origin(candidate)
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                field = candidate.model_fields.get(str(part))
                if field is not None:
                    following.extend(_unwrap(field.annotation))
            elif origin in (list, dict):
                following.extend(_unwrap(typing.get_args(candidate)[-1]))
        if isinstance(current, dict):
            current = current.get(part)
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            current = current[part]
        else:
            current = None
        models = [c for c in following if isinstance(c, type) and issubclass(c, BaseModel)]
        if isinstance(current, dict) and "kind" in current and len(models) > 1:
            # A discriminated union: the file's `kind` says which stage model applies.
            chosen = [m for m in models if _kind_of(m) == current["kind"]]
            following = chosen or following
        candidates = following
    return sorted(
        {
            name
            for c in candidates
            if isinstance(c, type) and issubclass(c, BaseModel)
            for name in c.model_fields
        }
    )


def _kind_of(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("kind")
    args = typing.get_args(field.annotation) if field is not None else ()
    return args[0] if args else None


def _describe(error: ErrorDetails, path: KeyPath, data: Any) -> str:
    """The human part of one pydantic error."""
    kind = error["type"]
    if kind == "extra_forbidden":
        known = _keys_at(path[:-1], data)
        close = difflib.get_close_matches(str(path[-1]), known, n=1)
        return "unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")
    if kind in ("missing", "union_tag_not_found"):
        return "missing required key"
    ctx = error.get("ctx") or {}
    if kind == "union_tag_invalid":
        return f"unknown kind {ctx.get('tag')!r} (expected {ctx.get('expected_tags')})"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "string_type" and isinstance(error["input"], (bool, int, float, type(None))):
        # YAML 1.1 reads `yes`, `off`, `1.10` and `null` as non-strings.
        return f"{error['msg']} (YAML read {error['input']!r}; quote the value)"
    return error["msg"]


def _refine(error: ErrorDetails) -> tuple[str | int, ...]:
    """The error's ``loc``, made more precise where the error says where it belongs."""
    loc = tuple(error["loc"])
    ctx = error.get("ctx") or {}
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        return (*loc, str(ctx.get("discriminator", "kind")).strip("'\""))
    at = ctx.get("at")
    if isinstance(at, tuple):
        return (*loc, *at)
    return loc


def _validation_message(
    source: str, exc: ValidationError, data: Any, marks: Mapping[KeyPath, yaml.Mark]
) -> str:
    located: list[tuple[int, str]] = []
    for error in exc.errors():
        if error["type"] == "default_factory_not_called":  # a consequence of another error
            continue
        path = _key_path(_refine(error), data)
        line = _line_of(path, marks)
        where = f"{format_path(path)}: " if path else ""
        located.append((line, f"{source}:{line}: {where}{_describe(error, path, data)}"))
    located.sort(key=lambda item: item[0])
    message = located[0][1]
    if len(located) > 1:
        message += f" (and {len(located) - 1} more)"
    return message


def _line_of(path: KeyPath, marks: Mapping[KeyPath, yaml.Mark]) -> int:
    """1-based line of ``path``, else of its nearest ancestor that the file has."""
    for end in range(len(path), -1, -1):
        mark = marks.get(path[:end])
        if mark is not None:
            return int(mark.line) + 1
    return 1


def _yaml_message(source: str, exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(filter(None, (exc.context, exc.problem)))
        line = f"{mark.line + 1}" if mark else "?"
        return f"{source}:{line}: invalid YAML: {' '.join(problem.split())}"
    return f"{source}: invalid YAML: {' '.join(str(exc).split())}"


# --------------------------------------------------------------------------- entry points


def parse_topology(
    text: str, source: str = "<string>", environ: Mapping[str, str] | None = None
) -> Topology:
    """Validate topology YAML ``text``; ``source`` names it in error messages."""
    loader = TopologyLoader(text, os.environ if environ is None else environ)
    try:
        data = loader.load_document()
    except _Located as exc:
        line = exc.mark.line + 1 if exc.mark else 1
        where = f"{format_path(exc.path)}: " if exc.path else ""
        raise ConfigError(f"{source}:{line}: {where}{exc.message}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_message(source, exc)) from None
    if data is None:
        raise ConfigError(f"{source}:1: the file is empty; a topology is a YAML mapping")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: a topology is a YAML mapping, not a {type(data).__name__}")
    try:
        return Topology.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_validation_message(source, exc, data, loader.key_marks)) from None


def load_topology(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> Topology:
    """Load and validate the topology file at ``path``.

    ``environ`` (default :data:`os.environ`) supplies ``${VAR}`` values.
    Every problem is a :class:`~pipeline.errors.ConfigError` with a one-line
    message that starts with ``path`` (and the line, when there is one).
    """
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a directory, not a topology file") from None
    except PermissionError:
        raise ConfigError(f"{source}: cannot read: permission denied") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None
    return parse_topology(text, source, environ)
