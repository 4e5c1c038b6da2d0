"""Where request tensors come from, and how they become request records.

A *source* yields :class:`RequestTemplate`s: the tensors, model and
parameters of one request, without an id. :class:`RecordBuilder` then stamps
each with a fresh correlation id (or the file's own, with ``keep_ids``) and
encodes it through :func:`pipeline.contract.request.encode_request`, so every
record ``pipeline produce`` writes is exactly what the contract says a
producer writes.

Sources:

* :func:`json_requests`: an OIP JSON request file, one object or JSON Lines;
  each request is validated with the contract's own decoder first, so a typo
  fails here, with the file and line, instead of in the dead-letter topic;
* :func:`npy_request`: one ``.npy`` array as a named input;
* :func:`wav_request`: a WAV file as FP32 ``[1, samples]`` (:mod:`pipeline.tools.audio`);
* :func:`random_requests`: endless random tensors shaped by a model's Triton metadata.

Errors a user can fix (missing file, bad JSON, wrong input name) are
:class:`~pipeline.errors.ConfigError` with one line naming the file.
"""

from __future__ import annotations

import itertools
import json
import math
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.contract import headers as h
from pipeline.contract import tensors
from pipeline.contract.errors import BadRequest
from pipeline.contract.payload import ParamValue
from pipeline.contract.records import Record
from pipeline.contract.request import (
    PRIORITY,
    SEQUENCE_END,
    SEQUENCE_ID,
    SEQUENCE_START,
    TIMEOUT,
    InferenceRequest,
    WireForm,
    decode_request,
    encode_request,
)
from pipeline.errors import ConfigError
from pipeline.tools.audio import read_wav

if TYPE_CHECKING:
    from pipeline.triton.admin import ModelDescription, TensorSpec

#: What ``--random`` puts where a model declares a variable (-1) dimension, unless told otherwise.
DEFAULT_LENGTH = 16


#: RequestTemplate fields that are encode_request's arguments of the same names.
_TEMPLATE_ARGUMENTS = ("model_name", "model_version", "datatypes", "requested_outputs", "parameters")


@dataclass(frozen=True, eq=False)
class RequestTemplate:
    """One request's content before it is given a correlation id and encoded.

    ``parameters`` holds every OIP request parameter, sequence ones included;
    ``own_id`` is the id the source file gave the request, if any.
    """

    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    model_name: str = ""
    model_version: str = ""
    requested_outputs: tuple[str, ...] = ()
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    own_id: str | None = None

    @property
    def sequence_key(self) -> str | None:
        """The sequence id of a stateful request: its records must share one key (one partition)."""
        value = self.parameters.get(SEQUENCE_ID)
        return None if value in (None, "", 0) else str(value)


# --------------------------------------------------------------------------- sources


def json_requests(path: str | Path) -> list[RequestTemplate]:
    """Read an OIP JSON request file: one object, a JSON array of them, or JSON Lines."""
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise ConfigError(f"{path}: file is empty")
    entries: list[tuple[int, Any]]
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as exc:
        if not exc.msg.startswith("Extra data"):
            raise ConfigError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
        entries = list(_json_lines(path, text))  # more than one value: JSON Lines
    else:
        entries = [(1, item) for item in whole] if isinstance(whole, list) else [(1, whole)]
    if not entries:
        raise ConfigError(f"{path}: no requests in the file")
    return [_template_from_json(path, line, body) for line, body in entries]


def npy_request(
    path: str | Path, input_name: str | None, model: ModelDescription | None = None
) -> RequestTemplate:
    """One ``.npy`` array as input ``input_name``.

    With a model known, a batch dimension of 1 is added when the array has the
    rank of one item (a ``[16]`` vector for a ``[-1, 16]`` input), and the array
    is cast to the input's datatype when numpy calls that cast same-kind
    (``float64`` -> ``FP32``; ``float`` -> ``INT64`` is refused). With no model,
    the array goes as it is, its datatype taken from its dtype.
    """
    path = Path(path)
    try:
        loaded = np.load(path, allow_pickle=False)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not a .npy array: {exc}") from None
    if not isinstance(loaded, np.ndarray):
        loaded.close()
        raise ConfigError(f"{path}: is an .npz archive; save the one array with numpy.save")
    array = loaded
    spec = pick_input(model, input_name) if model is not None else None
    name = spec.name if spec is not None else _required_input_name(input_name, "--npy")
    if spec is None:
        datatype = _datatype_of(array, path)
    else:
        assert model is not None
        if model.batching and array.ndim == len(spec.shape):
            array = array[np.newaxis, ...]
        datatype = spec.datatype
        wanted = tensors.numpy_dtype(datatype)
        if datatype != "BYTES" and array.dtype != wanted:
            if not np.can_cast(array.dtype, wanted, casting="same_kind"):
                raise ConfigError(
                    f"{path}: holds {array.dtype}, but input {name!r} of {model.name!r} is {datatype}"
                )
            array = array.astype(wanted)
    return RequestTemplate(inputs={name: array}, datatypes={name: datatype})


def wav_request(
    path: str | Path, input_name: str | None, model: ModelDescription | None = None
) -> RequestTemplate:
    """A WAV file as FP32 ``[1, samples]`` (mono; multi-channel files are down-mixed)."""
    name = (
        pick_input(model, input_name).name
        if model is not None
        else _required_input_name(input_name, "--wav")
    )
    audio = read_wav(path).mono()
    return RequestTemplate(inputs={name: audio[np.newaxis, :]}, datatypes={name: "FP32"})


def random_requests(
    model: ModelDescription, *, length: int = DEFAULT_LENGTH, seed: int | None = None
) -> Iterator[RequestTemplate]:
    """Endless requests of random tensors for ``model``: one row each, every required input.

    Variable dimensions (-1) become ``length``. Values suit the datatype:
    standard normal floats, small non-negative integers, fair booleans, short
    ASCII strings. The same ``seed`` gives the same requests.
    """
    if length < 1:
        raise ConfigError("--length must be at least 1")
    specs = [spec for spec in model.inputs if not spec.optional]
    if not specs:
        raise ConfigError(f"model {model.name!r} declares no required inputs to generate")
    rng = np.random.default_rng(seed)
    shapes = {spec.name: _item_shape(spec, length, batching=model.batching) for spec in specs}
    while True:
        inputs = {spec.name: _random_array(rng, spec.datatype, shapes[spec.name]) for spec in specs}
        yield RequestTemplate(inputs=inputs, datatypes={spec.name: spec.datatype for spec in specs})


def repeat(templates: Iterable[RequestTemplate], count: int) -> Iterator[RequestTemplate]:
    """``count`` templates, cycling through ``templates`` (a JSON Lines file repeats)."""
    if count < 0:
        raise ConfigError("--count must be >= 0")
    return itertools.islice(itertools.cycle(templates), count)


def pick_input(model: ModelDescription, name: str | None) -> TensorSpec:
    """The model input ``name``, or the model's only required input when no name is given."""
    if name is not None:
        return model.input(name)  # ConfigError naming the inputs it has
    required = [s for s in model.inputs if not s.optional]
    if len(required) != 1:
        names = ", ".join(s.name for s in required)
        raise ConfigError(f"model {model.name!r} has inputs {names}: choose one with --input NAME")
    return required[0]


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RecordOptions:
    """How templates become records (the CLI flags that are not about the source)."""

    form: WireForm = WireForm.PROTOBUF
    id_prefix: str = ""
    keep_ids: bool = False
    key: str | None = None
    priority: int | None = None


class RecordBuilder:
    """Encodes templates as request records, each with its own correlation id.

    Generated ids are ``<prefix><run>-<n>``: ``run`` is random per builder, so
    two runs never collide, and ``n`` counts from 1, so ids sort in send order.
    The record key is ``options.key``, else the sequence id of a stateful
    request, else the correlation id.
    """

    def __init__(self, options: RecordOptions) -> None:
        self.options = options
        self.run_id = secrets.token_hex(4)
        self._counter = itertools.count(1)

    def next_id(self) -> str:
        return f"{self.options.id_prefix}{self.run_id}-{next(self._counter):06d}"

    def build(self, template: RequestTemplate) -> Record:
        own = template.own_id if self.options.keep_ids else None
        correlation_id = own or self.next_id()
        key = self.options.key if self.options.key is not None else template.sequence_key
        described = {name: getattr(template, name) for name in _TEMPLATE_ARGUMENTS}
        return encode_request(
            template.inputs,
            correlation_id=correlation_id,
            form=self.options.form,
            priority=self.options.priority,
            key=key if key is not None else correlation_id,
            **described,
        )


# --------------------------------------------------------------------------- helpers


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None


def _json_lines(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: invalid JSON: {exc.msg}") from None


def _template_from_json(path: Path, line: int, body: Any) -> RequestTemplate:
    """Validate one JSON request with the contract's decoder and keep what it means."""
    if not isinstance(body, dict):
        raise ConfigError(
            f"{path}:{line}: a request must be a JSON object, got {type(body).__name__}"
        )
    value = json.dumps(body).encode("utf-8")
    record_headers = h.encode_headers([(h.CONTENT_TYPE, h.JSON)])
    if not body.get(
        "id"
    ):  # an id is given per record anyway; do not fail the check for its absence
        record_headers += h.encode_headers([(h.CORRELATION_ID, "validation")])
    try:
        request = decode_request(value, record_headers)
    except BadRequest as exc:
        raise ConfigError(f"{path}:{line}: not a valid OIP request: {exc}") from None
    # The template shares its field names with the request; only these two are its own.
    same = {f.name: getattr(request, f.name) for f in fields(RequestTemplate) if f.name not in ("parameters", "own_id")}
    return RequestTemplate(**same, parameters=_all_parameters(request), own_id=body.get("id") or None)


def _all_parameters(request: InferenceRequest) -> dict[str, ParamValue]:
    """The decoder lifts sequence/priority/timeout out of ``parameters``; put them back."""
    params: dict[str, ParamValue] = dict(request.parameters)
    if request.sequence_id is not None:
        params[SEQUENCE_ID] = request.sequence_id
        params[SEQUENCE_START] = request.sequence_start
        params[SEQUENCE_END] = request.sequence_end
    if request.priority is not None:
        params[PRIORITY] = request.priority
    if request.timeout_us is not None:
        params[TIMEOUT] = request.timeout_us
    return params


def _required_input_name(name: str | None, flag: str) -> str:
    if not name:
        raise ConfigError(
            f"{flag} needs --input NAME (or --topology/--model to take it from the model)"
        )
    return name


def _datatype_of(array: np.ndarray, path: Path) -> str:
    try:
        return tensors.datatype_of(array)
    except tensors.TensorEncodingError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _item_shape(spec: TensorSpec, length: int, *, batching: bool) -> tuple[int, ...]:
    dims = tuple(length if d < 0 else d for d in spec.shape)
    return (1, *dims) if batching else dims


def _random_array(rng: np.random.Generator, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = tensors.numpy_dtype(datatype)
    if datatype.startswith("FP"):
        return rng.standard_normal(shape).astype(dtype)
    if datatype.startswith(("INT", "UINT")):
        return rng.integers(0, 100, size=shape).astype(dtype)
    if datatype == "BOOL":
        return rng.random(shape) < 0.5
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    words = [bytes(rng.choice(letters, size=8)) for _ in range(int(np.prod(shape)))]
    array = np.empty(len(words), dtype=object)
    array[:] = words
    return array.reshape(shape)


def describe_inputs(template: RequestTemplate) -> str:
    """``features FP32 [1, 16]``: a one-line account of what a request carries."""
    return ", ".join(
        f"{name} {template.datatypes[name]} {list(np.shape(array))}"
        for name, array in template.inputs.items()
    )


__all__ = [
    "DEFAULT_LENGTH",
    "RecordBuilder",
    "RecordOptions",
    "RequestTemplate",
    "audio_chunk",
    "describe_inputs",
    "json_requests",
    "npy_request",
    "pick_input",
    "random_requests",
    "repeat",
    "wav_request",
]


# --------------------------------------------------------------------------- audio streams


@dataclass(frozen=True)
class AudioStreamPlan:
    """How a WAV file is cut into a stream of chunks."""

    chunk_samples: int
    sample_rate: int
    chunks: int

    @property
    def chunk_ms(self) -> float:
        return 1000 * self.chunk_samples / self.sample_rate


def chunk_samples_for(sample_rate: int, chunk_ms: float, target_rate: int = 16_000) -> int:
    """Samples per chunk near ``chunk_ms``, resampling to a whole number of ``target_rate`` samples.

    The preprocessing stage resamples each chunk on its own; a chunk whose output
    length is fractional would be rounded, and a long stream would drift. So the
    chunk length is a multiple of ``rate / gcd(rate, target_rate)`` (441 samples =
    20 ms at 22.05 kHz; 1 at 16 kHz, where any length is exact).
    """
    step = sample_rate // math.gcd(sample_rate, target_rate)
    wanted = sample_rate * chunk_ms / 1000
    return max(step, round(wanted / step) * step)


def audio_stream_requests(
    path: str | Path,
    *,
    chunk_ms: float,
    stream: str,
    as_wav: bool = False,
    target_rate: int = 16_000,
) -> tuple[list[RequestTemplate], AudioStreamPlan]:
    """A WAV file as one stream: a request per chunk with Triton's sequence parameters.

    Each chunk is raw PCM at the file's own rate (INT16 for 16-bit files, else FP32),
    ``[frames, channels]``, with a ``sample_rate`` parameter; or, with ``as_wav``, a
    small WAV file in a BYTES tensor. The pipeline decodes, downmixes and resamples.
    """
    from pipeline.audio import SampleFormat

    audio = read_wav(Path(path))
    size = chunk_samples_for(audio.sample_rate, chunk_ms, target_rate)
    count = max(1, -(-audio.info.frames // size))
    pcm16 = audio.info.sample_format is SampleFormat.PCM_S16  # sent as INT16; all else as FP32
    sent_as = SampleFormat.PCM_S16 if pcm16 else SampleFormat.FLOAT32
    templates = []
    for index in range(count):
        piece = audio.samples[index * size : (index + 1) * size]
        if sent_as is SampleFormat.PCM_S16:
            pcm = np.clip(np.round(piece * 32768.0), -32768, 32767).astype("<i2")
        else:
            pcm = np.ascontiguousarray(piece, dtype=np.float32)
        templates.append(
            audio_chunk(
                pcm, index=index, stream=stream, end=index == count - 1,
                sample_rate=audio.sample_rate, as_wav=as_wav,
            )
        )
    return templates, AudioStreamPlan(size, audio.sample_rate, count)


def audio_chunk(
    pcm: np.ndarray, *, index: int, stream: str, end: bool, sample_rate: int, as_wav: bool = False
) -> RequestTemplate:
    """One chunk of a stream as a request: ``pcm`` is ``[frames]`` or ``[frames, channels]``,
    INT16 or float samples in [-1, 1] (sent as FP32), at ``sample_rate``; ``chunk_index``
    and Triton's sequence parameters set (start on chunk 0, end when ``end``). With
    ``as_wav``, the chunk travels as a small WAV file in a BYTES tensor."""
    from pipeline.audio import SampleFormat
    from pipeline.audio.wav import canonical_wav

    pcm = np.asarray(pcm)
    pcm = pcm[:, None] if pcm.ndim == 1 else pcm
    sent_as = SampleFormat.PCM_S16 if pcm.dtype == np.int16 else SampleFormat.FLOAT32
    pcm = pcm.astype("<i2") if sent_as is SampleFormat.PCM_S16 else np.ascontiguousarray(pcm, dtype=np.float32)
    parameters: dict[str, ParamValue] = {
        "chunk_index": index,
        SEQUENCE_ID: stream,
        SEQUENCE_START: index == 0,
        SEQUENCE_END: end,
    }
    if as_wav:
        wav = canonical_wav(sent_as.format_tag, pcm.shape[1], sample_rate, sent_as.bits, pcm.tobytes())
        return RequestTemplate(
            inputs={"audio": np.array([wav], dtype=object)}, datatypes={"audio": "BYTES"}, parameters=parameters
        )
    parameters["sample_rate"] = sample_rate
    datatype = "INT16" if sent_as is SampleFormat.PCM_S16 else "FP32"
    return RequestTemplate(inputs={"audio": pcm}, datatypes={"audio": datatype}, parameters=parameters)
