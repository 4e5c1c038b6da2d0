"""Where a command connects: ``-b``, ``-X``, ``--kafka-config``, ``--triton``, ``--s3``, ``--no-embedded``.

Why the flags become ``PIPELINE_*`` environment variables of this process
instead of arguments threaded through every call: every client the command
makes (``KafkaSettings()``, the Python client, the processes ``pipeline run``
supervises) already reads them, so one assignment reaches all of them, with the
same meaning as exporting the variable by hand. A flag wins over the topology
file's endpoint too (:func:`load_target`), as a flag does in any Kafka tool.

The endpoints line: each command says which Kafka/Triton/S3 it uses, and where
that came from, on the first line of stderr, so a silent fall-back to the
embedded stack is visible. It is held back until the command writes something
else to stderr or succeeds; a command that fails first prints its one-line
error alone, as scripts parsing that line expect.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from pipeline.cli.kafka_props import kafka_environment, parse_assignment, property_fields, read_properties

if TYPE_CHECKING:
    from pipeline.settings import KafkaSettings, S3Settings, TritonSettings
    from pipeline.tools.target import Target

F = TypeVar("F", bound=Callable[..., Any])

_KAFKA_FLAGS: dict[str, Any] = {
    "bootstrap_server": Annotated[
        str | None,
        typer.Option(
            "-b",
            "--bootstrap-server",
            metavar="HOST:PORT",
            help="Kafka bootstrap servers, comma-separated; wins over the topology's and the environment's.",
            show_default=False,
        ),
    ],
    "kafka_property": Annotated[
        list[str] | None,
        typer.Option(
            "-X",
            metavar="KEY=VALUE",
            help="Kafka client property by its librdkafka or Java name (security.protocol, sasl.mechanism, "
            "sasl.username, sasl.password, ssl.ca.location, client.id...); repeatable.",
            show_default=False,
        ),
    ],
    "kafka_config": Annotated[
        Path | None,
        typer.Option(
            "--kafka-config",
            metavar="FILE",
            help="Kafka client properties file in the Java client's format; -X entries override it.",
            show_default=False,
        ),
    ],
}
_TRITON_FLAG = Annotated[
    str | None,
    typer.Option(
        "--triton",
        metavar="URL",
        help="Triton gRPC endpoint, host:port (grpcs://host:port for TLS); wins over the topology's.",
        show_default=False,
    ),
]
_S3_FLAG = Annotated[
    str | None,
    typer.Option("--s3", metavar="URL", help="S3 model store endpoint, http(s)://host:port.", show_default=False),
]
_NO_EMBEDDED_FLAG = Annotated[
    bool,
    typer.Option(
        "--no-embedded",
        help="Fail when an endpoint is not configured instead of using the embedded stack "
        "(also PIPELINE_NO_EMBEDDED=1).",
    ),
]


@dataclass(frozen=True)
class Flags:
    """The connection flags one command was given."""

    bootstrap_server: str | None = None
    kafka_property: tuple[str, ...] = ()
    kafka_config: Path | None = None
    triton: str | None = None
    s3: str | None = None
    no_embedded: bool = False

    def environment(self) -> dict[str, str]:
        """The ``PIPELINE_*`` variables these flags set (every ``-X`` key and value checked)."""
        pairs = read_properties(self.kafka_config) if self.kafka_config is not None else []
        pairs += [parse_assignment(item) for item in self.kafka_property]
        fields = property_fields(pairs)
        if self.bootstrap_server:
            fields["bootstrap_servers"] = self.bootstrap_server
        env = kafka_environment(fields) if fields else {}
        if self.triton:
            env["PIPELINE_TRITON_GRPC_URL"] = self.triton
        if self.s3:
            env["PIPELINE_S3_ENDPOINT"] = self.s3
        if self.no_embedded:
            env["PIPELINE_NO_EMBEDDED"] = "1"
        return env


_given = Flags()


def given() -> Flags:
    """The flags of the running command (all unset outside a command)."""
    return _given


def apply(flags: Flags) -> None:
    """Check ``flags`` and export them to this process's environment (see the module's why)."""
    global _given
    os.environ.update(flags.environment())
    _given = flags


def connection_options(*, kafka: bool = False, triton: bool = False, s3: bool = False) -> Callable[[F], F]:
    """Add the connection flags to a command (``kafka``: ``-b``, ``-X``, ``--kafka-config``;
    ``triton``: ``--triton``; ``s3``: ``--s3``; always ``--no-embedded``).

    Why a decorator: a dozen commands take the same flags with the same help; each
    command's signature keeps only its own options, and the flags are applied before
    its body runs. Typer reads the extended ``__signature__``."""
    extra: dict[str, Any] = dict(_KAFKA_FLAGS) if kafka else {}
    if triton:
        extra["triton"] = _TRITON_FLAG
    if s3:
        extra["s3"] = _S3_FLAG
    extra["no_embedded"] = _NO_EMBEDDED_FLAG

    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=annotation,
                default=False if name == "no_embedded" else None,
            )
            for name, annotation in extra.items()
        ]
        parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in signature.parameters.values()]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in extra}
            values["kafka_property"] = tuple(values.get("kafka_property") or ())
            apply(Flags(**values))
            result = command(**kwargs)
            flush_endpoints_line()
            return result

        wrapper.__signature__ = signature.replace(parameters=parameters + added)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters + added}
        wrapper.__annotations__["return"] = signature.return_annotation
        return wrapper  # type: ignore[return-value]

    return decorate


def load_target(topology: Path | None, *, model: str | None = None) -> Target:
    """:meth:`Target.load`, minus the topology's own Kafka/Triton endpoint where a flag names one."""
    from pipeline.tools.target import Target

    target = Target.load(topology, model=model)
    topo = target.topology
    if topo is None or not (_given.bootstrap_server or _given.triton):
        return target
    update: dict[str, Any] = {}
    if _given.bootstrap_server and topo.kafka.bootstrap_servers:
        update["kafka"] = topo.kafka.model_copy(update={"bootstrap_servers": None})
    if _given.triton and topo.triton.grpc_url:
        update["triton"] = topo.triton.model_copy(update={"grpc_url": None})
    if not update:
        return target
    return Target(topology=topo.model_copy(update=update), model=target.model, model_version=target.model_version)


def topology_argument(positional: Path | None, option: Path | None) -> Path | None:
    """The topology, positional; the deprecated ``--topology`` still accepted."""
    from pipeline.errors import ConfigError

    if positional is not None and option is not None and positional != option:
        raise ConfigError("the topology is given twice: as TOPOLOGY and as --topology (deprecated); give one")
    return positional or option


def required_topology(positional: Path | None, option: Path | None) -> Path:
    """:func:`topology_argument` for commands that cannot work without one."""
    from pipeline.errors import ConfigError

    found = topology_argument(positional, option)
    if found is None:
        raise ConfigError("missing TOPOLOGY: the topology file, e.g. topologies/dense.yaml")
    return found


# --------------------------------------------------------------------------- the endpoints line


def _source(variable: str, value: str, topology_value: str | None, flag: str | None) -> str:
    from pipeline.endpoints import read_stack_state

    if flag and flag == value:
        return "flag"
    if topology_value and topology_value == value:
        return "topology"
    if os.environ.get(variable) == value:
        return variable
    state = read_stack_state()
    if state is not None and isinstance(env := state.get("environment"), dict) and env.get(variable) == value:
        return "embedded stack"
    return "default"


def endpoints_text(
    *,
    kafka: KafkaSettings | None = None,
    triton: TritonSettings | None = None,
    s3: S3Settings | None = None,
    target: Target | None = None,
) -> str:
    """``endpoints: kafka HOST (SOURCE), triton HOST (SOURCE), s3 URL (SOURCE)`` for those given."""
    topo = target.topology if target is not None else None
    parts = []
    if kafka is not None and kafka.bootstrap_servers:
        source = _source(
            "PIPELINE_KAFKA_BOOTSTRAP_SERVERS",
            kafka.bootstrap_servers,
            topo.kafka.bootstrap_servers if topo else None,
            _given.bootstrap_server,
        )
        security = "" if kafka.security_protocol == "PLAINTEXT" else f" {kafka.security_protocol}"
        parts.append(f"kafka {kafka.bootstrap_servers}{security} ({source})")
    if triton is not None and triton.grpc_url:
        source = _source("PIPELINE_TRITON_GRPC_URL", triton.grpc_url, topo.triton.grpc_url if topo else None, _given.triton)
        parts.append(f"triton {triton.grpc_url} ({source})")
    if s3 is not None and s3.endpoint:
        source = _source("PIPELINE_S3_ENDPOINT", s3.endpoint, None, _given.s3)
        parts.append(f"s3 {s3.endpoint} bucket {s3.bucket} ({source})")
    return "endpoints: " + ", ".join(parts) if parts else ""


class _EndpointsLine:
    """Holds the endpoints line until stderr is first written to, or the command succeeds."""

    def __init__(self) -> None:
        self.pending: str | None = None

    def flush(self, stream: IO[str]) -> None:
        text, self.pending = self.pending, None
        if text:
            stream.write(text + "\n")
            stream.flush()


_line = _EndpointsLine()


def announce(text: str) -> None:
    """Make ``text`` the endpoints line (replacing one not printed yet)."""
    if text:
        _line.pending = text


def flush_endpoints_line() -> None:
    stream = sys.stderr
    _line.flush(stream.wrapped if isinstance(stream, EndpointsFirst) else stream)


def drop_endpoints_line() -> str | None:
    """Forget the line not printed yet (a failing command prints its error alone); the line."""
    text, _line.pending = _line.pending, None
    return text


_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\s")


def _visible(text: str) -> bool:
    return bool(_CONTROL.sub("", text))


class EndpointsFirst:
    """``sys.stderr`` for the CLI's lifetime: prints the pending endpoints line before the first
    write, whoever writes (rich consoles, ``print``, logging handlers)."""

    def __init__(self, wrapped: IO[str]) -> None:
        self.wrapped = wrapped

    def write(self, text: str) -> int:
        # Only visible text releases the line: a console's cursor or colour codes and bare
        # newlines come before a failing command's one-line error too (`pipeline run`).
        if _line.pending and text and _visible(text):
            _line.flush(self.wrapped)
        return self.wrapped.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)
