"""Model management on a Triton Inference Server, typed and synchronous.

``tritonclient`` hands back raw protobuf messages and raises one exception
type for everything, from "connection refused" to "unknown model". This
wrapper turns the answers into small dataclasses that the rest of the code
(topology validation, the batching stage, the CLI) can rely on, and turns the
failures into one-line :class:`~pipeline.errors.PipelineError` messages:
:class:`~pipeline.errors.EndpointUnreachable` when the server does not
answer, a plain :class:`~pipeline.errors.PipelineError` when it answers "no".

Shapes: Triton's *model configuration* lists per-item ``dims`` (without the
batch dimension when ``max_batch_size > 0``); its *model metadata* prefixes
``-1`` for the batch dimension. :class:`TensorSpec` carries both, as
``shape`` and ``batched_shape``, so nobody has to re-derive one from the other.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException
from typing_extensions import Self

from pipeline.errors import ConfigError, EndpointUnreachable, PipelineError
from pipeline.settings import TritonSettings
from pipeline.triton.client import grpc_target, sync_client

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0
"""Per-call deadline for queries: a server that does not answer in that time is unreachable."""

LOAD_TIMEOUT_S = 300.0
"""Loading runs the model's own initialisation (imports, weights); give it minutes."""

# How gRPC words "nothing answered" (status UNAVAILABLE is also used by Triton
# for "model not available", so the status code alone cannot tell).
_TRANSPORT_MARKERS = (
    "failed to connect",
    "connection refused",
    "dns resolution failed",
    "socket closed",
    "connection reset",
    "no route to host",
    "deadline exceeded",
    "name resolution",
    "errors resolving",
)


# --------------------------------------------------------------------------- types


@dataclass(frozen=True)
class TensorSpec:
    """An input or output tensor.

    ``shape`` is the per-item shape from the model configuration (what one
    request item carries); ``batched_shape`` is the shape Triton's metadata
    reports, with a leading ``-1`` when the model batches. ``-1`` elsewhere
    means a variable-size dimension.
    """

    name: str
    datatype: str  # KServe v2 name: FP32, INT64, BYTES, ...
    shape: list[int]
    batched_shape: list[int]
    optional: bool = False


@dataclass(frozen=True)
class DynamicBatching:
    """Server-side batching of independent requests."""

    preferred_batch_size: list[int]
    max_queue_delay_microseconds: int
    preserve_ordering: bool


@dataclass(frozen=True)
class SequenceControl:
    """A control tensor Triton fills in for sequence (stateful) models.

    ``kind`` is ``START``, ``END``, ``READY`` or ``CORRID``; ``datatype`` is
    the tensor type Triton writes (the correlation id's type for ``CORRID``).
    """

    name: str
    kind: str
    datatype: str


@dataclass(frozen=True)
class SequenceState:
    """Implicit state Triton carries between requests of one sequence."""

    input_name: str
    output_name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True)
class SequenceBatching:
    """Routing of a sequence's requests to the same model instance slot."""

    strategy: Literal["direct", "oldest"]
    max_sequence_idle_microseconds: int
    max_queue_delay_microseconds: int
    preferred_batch_size: list[int]  # "oldest" only
    max_candidate_sequences: int  # "oldest" only; 0 for "direct"
    controls: list[SequenceControl]
    states: list[SequenceState]

    def control(self, kind: str) -> SequenceControl | None:
        """The control input of ``kind`` (e.g. ``"CORRID"``), if the model declares one."""
        return next((c for c in self.controls if c.kind == kind), None)


@dataclass(frozen=True)
class InstanceGroup:
    """How many copies of the model run, and where (``CPU``, ``GPU``, ``MODEL``, ``AUTO``)."""

    name: str
    kind: str
    count: int
    gpus: list[int]


@dataclass(frozen=True)
class ModelDescription:
    """What a loaded model accepts and how Triton schedules it."""

    name: str
    versions: list[int]
    platform: str
    backend: str
    max_batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None
    instance_groups: list[InstanceGroup] = field(default_factory=list)
    decoupled: bool = False

    @property
    def batching(self) -> bool:
        """True when requests carry a leading batch dimension (``max_batch_size > 0``)."""
        return self.max_batch_size > 0

    def input(self, name: str) -> TensorSpec:
        return _by_name(self.inputs, name, f"model {self.name!r} has no input")

    def output(self, name: str) -> TensorSpec:
        return _by_name(self.outputs, name, f"model {self.name!r} has no output")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible data (``--json`` output, logs, fixtures)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RepositoryEntry:
    """One line of Triton's repository index: a model version and its state."""

    name: str
    version: str  # empty when Triton has no version loaded
    state: str  # READY, UNAVAILABLE, LOADING, UNLOADING, or empty when never loaded
    reason: str


def _by_name(specs: list[TensorSpec], name: str, what: str) -> TensorSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    known = ", ".join(s.name for s in specs) or "none"
    raise ConfigError(f"{what} {name!r} (it has: {known})")


# --------------------------------------------------------------------------- conversion


def datatype_name(data_type: int) -> str:
    """``TYPE_FP32`` (config enum) -> ``FP32`` (KServe v2 name); ``TYPE_STRING`` is ``BYTES``."""
    name = model_config_pb2.DataType.Name(data_type).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _tensor_specs(
    configured: Any, metadata: Any, *, batching: bool, optional: bool
) -> list[TensorSpec]:
    """Merge config tensors (per-item dims, optional) with metadata (datatype, batched shape)."""
    reported = {t.name: t for t in metadata}
    specs = []
    for tensor in configured:
        meta = reported.get(tensor.name)
        shape = list(tensor.dims)
        specs.append(
            TensorSpec(
                name=tensor.name,
                datatype=meta.datatype if meta else datatype_name(tensor.data_type),
                shape=shape,
                batched_shape=list(meta.shape) if meta else ([-1, *shape] if batching else shape),
                optional=bool(optional and tensor.optional),
            )
        )
    return specs


def _dynamic_batching(config: model_config_pb2.ModelConfig) -> DynamicBatching | None:
    if not config.HasField("dynamic_batching"):
        return None
    db = config.dynamic_batching
    return DynamicBatching(
        preferred_batch_size=list(db.preferred_batch_size),
        max_queue_delay_microseconds=int(db.max_queue_delay_microseconds),
        preserve_ordering=db.preserve_ordering,
    )


_CONTROL_VALUE_TYPES = (
    ("int32_false_true", "INT32"),
    ("fp32_false_true", "FP32"),
    ("bool_false_true", "BOOL"),
)


def _control_datatype(control: model_config_pb2.ModelSequenceBatching.Control) -> str:
    """The tensor type Triton writes for a control: explicit for CORRID, implied by values otherwise."""
    if control.kind == model_config_pb2.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
        return datatype_name(control.data_type)
    for attribute, datatype in _CONTROL_VALUE_TYPES:
        if len(getattr(control, attribute)):
            return datatype
    return datatype_name(control.data_type)


def _sequence_batching(config: model_config_pb2.ModelConfig) -> SequenceBatching | None:
    if not config.HasField("sequence_batching"):
        return None
    sb = config.sequence_batching
    kind_name = model_config_pb2.ModelSequenceBatching.Control.Kind.Name
    controls = [
        SequenceControl(
            name=ci.name,
            kind=kind_name(c.kind).removeprefix("CONTROL_SEQUENCE_"),
            datatype=_control_datatype(c),
        )
        for ci in sb.control_input
        for c in ci.control
    ]
    states = [
        SequenceState(
            input_name=s.input_name,
            output_name=s.output_name,
            datatype=datatype_name(s.data_type),
            shape=list(s.dims),
        )
        for s in sb.state
    ]
    oldest = sb.WhichOneof("strategy_choice") == "oldest"
    return SequenceBatching(
        strategy="oldest" if oldest else "direct",
        max_sequence_idle_microseconds=int(sb.max_sequence_idle_microseconds),
        max_queue_delay_microseconds=int(
            sb.oldest.max_queue_delay_microseconds
            if oldest
            else sb.direct.max_queue_delay_microseconds
        ),
        preferred_batch_size=list(sb.oldest.preferred_batch_size) if oldest else [],
        max_candidate_sequences=int(sb.oldest.max_candidate_sequences) if oldest else 0,
        controls=controls,
        states=states,
    )


def _instance_groups(config: model_config_pb2.ModelConfig) -> list[InstanceGroup]:
    kind_name = model_config_pb2.ModelInstanceGroup.Kind.Name
    return [
        InstanceGroup(
            name=g.name,
            kind=kind_name(g.kind).removeprefix("KIND_"),
            count=int(g.count),
            gpus=list(g.gpus),
        )
        for g in config.instance_group
    ]


def describe_from(metadata: Any, config: model_config_pb2.ModelConfig) -> ModelDescription:
    """Build a :class:`ModelDescription` from a metadata response and a model config.

    Separate from the client so it can be tested with hand-made messages.
    """
    batching = config.max_batch_size > 0
    return ModelDescription(
        name=config.name or metadata.name,
        versions=sorted(int(v) for v in metadata.versions if str(v).isdigit()),
        platform=config.platform or metadata.platform,
        backend=config.backend,
        max_batch_size=int(config.max_batch_size),
        inputs=_tensor_specs(config.input, metadata.inputs, batching=batching, optional=True),
        outputs=_tensor_specs(config.output, metadata.outputs, batching=batching, optional=False),
        dynamic_batching=_dynamic_batching(config),
        sequence_batching=_sequence_batching(config),
        instance_groups=_instance_groups(config),
        decoupled=config.model_transaction_policy.decoupled,
    )


# --------------------------------------------------------------------------- client


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _message(exc: InferenceServerException) -> str:
    return _one_line(exc.message() or exc.status() or "unknown error")


def _is_transport_failure(exc: InferenceServerException) -> bool:
    """True when the error says nothing answered, rather than that Triton said no."""
    status = exc.status() or ""
    if status == "StatusCode.DEADLINE_EXCEEDED":
        return True
    if status != "StatusCode.UNAVAILABLE":
        return False
    text = (exc.message() or "").lower()
    return any(marker in text for marker in _TRANSPORT_MARKERS)


class TritonAdmin:
    """Management calls (health, index, describe, load, unload) on one Triton server.

    Every call has a deadline, so a dead or black-holed server costs seconds,
    not a hang. Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, settings: TritonSettings, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._client = sync_client(settings)  # ConfigError when no endpoint is configured
        target, scheme_tls = grpc_target(settings.grpc_url or "")
        self.tls = settings.ssl or scheme_tls
        self.url = f"grpcs://{target}" if self.tls else target
        self.timeout = timeout

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    # -- plumbing -----------------------------------------------------------

    def _call(self, fn: Callable[..., T], *args: Any, timeout: float | None = None, **kw: Any) -> T:
        """Run one client call; transport failures become :class:`EndpointUnreachable`."""
        try:
            return fn(*args, client_timeout=timeout or self.timeout, **kw)
        except InferenceServerException as exc:
            if _is_transport_failure(exc):
                raise EndpointUnreachable(self._unreachable(exc)) from None
            raise

    def _unreachable(self, exc: InferenceServerException) -> str:
        text = f"cannot reach Triton at {self.url}: {_message(exc)}"
        if not self.tls and "socket closed" in text.lower():
            text += " (if the server speaks TLS, use a grpcs:// URL)"
        return text

    # -- health -------------------------------------------------------------

    def ping(self) -> None:
        """Raise :class:`EndpointUnreachable` unless the server answers at all."""
        try:
            self._call(self._client.is_server_live)
        except InferenceServerException as exc:
            raise EndpointUnreachable(self._unreachable(exc)) from None

    def is_ready(self) -> bool:
        return bool(self._call(self._client.is_server_ready))

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.25) -> None:
        """Block until the server reports ready; :class:`EndpointUnreachable` after ``timeout``."""
        deadline = time.monotonic() + timeout
        last = "not ready"
        while True:
            try:
                if self._client.is_server_ready(client_timeout=min(self.timeout, timeout)):
                    return
                last = "server is up but not ready"
            except InferenceServerException as exc:
                last = _message(exc)
            if time.monotonic() >= deadline:
                raise EndpointUnreachable(
                    f"Triton at {self.url} not ready after {timeout:g}s: {last}"
                )
            time.sleep(interval)

    # -- repository ---------------------------------------------------------

    def repository_index(self) -> list[RepositoryEntry]:
        """Every model version Triton's repository holds, loaded or not."""
        try:
            index = self._call(self._client.get_model_repository_index)
        except InferenceServerException as exc:
            raise PipelineError(f"Triton repository index failed: {_message(exc)}") from None
        return [
            RepositoryEntry(
                name=m.name, version=m.version, state=m.state, reason=_one_line(m.reason)
            )
            for m in index.models
        ]

    def model_states(self, name: str) -> list[RepositoryEntry]:
        """The index entries of one model (empty when Triton does not know it)."""
        return [e for e in self.repository_index() if e.name == name]

    def describe(self, model: str, version: str = "") -> ModelDescription:
        """Inputs, outputs, batching and instances of a *loaded* model."""
        try:
            metadata = self._call(self._client.get_model_metadata, model, version)
            config = self._call(self._client.get_model_config, model, version).config
        except InferenceServerException as exc:
            raise self._not_available(model, version, exc) from None
        return describe_from(metadata, config)

    def loaded_parameter(self, name: str, key: str) -> str | None:
        """``parameters[key]`` of the READY model ``name``'s configuration; None when the model
        is not READY or has no such parameter (what a generated model's digest is compared with)."""
        if not any(e.state == "READY" for e in self.model_states(name)):
            return None
        try:
            config = self._call(self._client.get_model_config, name).config
        except InferenceServerException:
            return None
        return config.parameters[key].string_value if key in config.parameters else None

    def load(self, name: str, timeout: float = LOAD_TIMEOUT_S) -> None:
        """Load (or reload) ``name`` from the repository; needs ``--model-control-mode=explicit``."""
        try:
            self._call(self._client.load_model, name, timeout=timeout)
        except InferenceServerException as exc:
            raise PipelineError(f"Triton could not load {name!r}: {_message(exc)}") from None

    def unload(self, name: str, wait: float = 30.0) -> None:
        """Unload ``name`` and wait (up to ``wait`` seconds) until no version is READY.

        Triton acknowledges an unload before the model has stopped; waiting
        makes "unload, then list" show the final state.
        """
        if not any(e.state in ("READY", "LOADING") for e in self.model_states(name)):
            raise PipelineError(self._not_loaded_text(name))
        try:
            self._call(self._client.unload_model, name)
        except InferenceServerException as exc:
            raise PipelineError(f"Triton could not unload {name!r}: {_message(exc)}") from None
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not any(e.state in ("READY", "UNLOADING") for e in self.model_states(name)):
                return
            time.sleep(0.2)

    # -- messages -----------------------------------------------------------

    def _not_available(
        self, model: str, version: str, exc: InferenceServerException
    ) -> PipelineError:
        """Explain why ``model`` cannot be described: unknown, not loaded, or Triton's own reason."""
        entries = self.model_states(model)
        if entries and not any(e.state == "READY" for e in entries):
            return PipelineError(self._not_loaded_text(model, entries))
        which = f"{model!r} version {version}" if version else repr(model)
        if not entries:
            return PipelineError(f"Triton has no model {which}: {_message(exc)}")
        return PipelineError(f"Triton cannot describe {which}: {_message(exc)}")

    def _not_loaded_text(self, name: str, entries: list[RepositoryEntry] | None = None) -> str:
        entries = self.model_states(name) if entries is None else entries
        if not entries:
            return f"Triton has no model {name!r} in its repository"
        states = "; ".join(
            f"{e.state or 'not loaded'}{': ' + e.reason if e.reason else ''}" for e in entries
        )
        return f"model {name!r} is not loaded on Triton ({states}); load it with `pipeline models load {name}`"
