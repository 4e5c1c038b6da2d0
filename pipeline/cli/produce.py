"""``pipeline produce``: put inference requests on a topic, the way a client application would.

The logic lives in :mod:`pipeline.tools` (sources, pacing, sending); this
module only turns flags into calls and prints. Heavy imports (numpy, aiokafka,
tritonclient) happen inside the command, so ``pipeline --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typing_extensions import Self

from pipeline.cli.app import app, console_err
from pipeline.cli.connection import announce as announce_endpoints
from pipeline.cli.connection import connection_options, endpoints_text, load_target, topology_argument
from pipeline.errors import ConfigError, PipelineError

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from pipeline.contract.records import Record
    from pipeline.settings import KafkaSettings
    from pipeline.tools.producer import ProduceStats
    from pipeline.tools.sources import RequestTemplate
    from pipeline.tools.target import Target
    from pipeline.triton.admin import ModelDescription

#: Seconds between plain progress lines when stderr is not a terminal.
PLAIN_PROGRESS_EVERY_S = 5.0


class WireFormat(str, Enum):
    protobuf = "protobuf"
    json = "json"


@app.command()
@connection_options(kafka=True, triton=True)
def produce(
    topology_file: Annotated[
        Path | None,
        typer.Argument(
            metavar="TOPOLOGY", help="Topology file: its input topic and first stage's model.", show_default=False
        ),
    ] = None,
    topology_option: Annotated[
        Path | None, typer.Option("--topology", hidden=True, help="Deprecated: give TOPOLOGY as the argument.")
    ] = None,
    topic: Annotated[str | None, typer.Option("--topic", help="Topic to write to (overrides the topology's).")] = None,
    lane: Annotated[
        str | None,
        typer.Option("--lane", help="Priority lane of the topology to write to (default: its input_topic)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model whose Triton metadata shapes --random/--npy (overrides the topology's)."),
    ] = None,
    json_file: Annotated[
        Path | None,
        typer.Option("--json", help="OIP JSON request file: one request, or JSON Lines; - reads standard input."),
    ] = None,
    npy_file: Annotated[Path | None, typer.Option("--npy", help="A .npy array, sent as input --input.")] = None,
    wav_file: Annotated[
        Path | None, typer.Option("--wav", help="A WAV file, sent as FP32 [1, samples] input --input.")
    ] = None,
    random: Annotated[
        bool, typer.Option("--random", help="Random tensors shaped by the model's Triton metadata.")
    ] = False,
    audio_file: Annotated[
        Path | None,
        typer.Option(
            "--audio", help="Stream a WAV file as chunks of one sequence (key = --key), for audio topologies."
        ),
    ] = None,
    chunk_ms: Annotated[
        float, typer.Option("--chunk-ms", min=1.0, help="--audio: chunk length (rounded so resampling is exact).")
    ] = 32.0,
    speed: Annotated[
        float, typer.Option("--speed", min=0.0, help="--audio: 1 = real time, 10 = ten times faster, 0 = no pacing.")
    ] = 1.0,
    chunk_wav: Annotated[
        bool, typer.Option("--chunk-wav", help="--audio: send each chunk as a WAV file instead of raw PCM.")
    ] = False,
    input_name: Annotated[
        str | None, typer.Option("--input", help="Input tensor name for --npy/--wav (default: the model's only input).")
    ] = None,
    count: Annotated[
        int | None,
        typer.Option(
            "--count",
            min=0,
            help="Requests to send (default: every request of a --json file, 1 for --npy/--wav, 100 for --random); a file's requests repeat to reach it.",
        ),
    ] = None,
    rate: Annotated[float, typer.Option("--rate", min=0.0, help="Requests per second; 0 = as fast as possible.")] = 0.0,
    key: Annotated[str | None, typer.Option("--key", help="Fixed record key (default: the correlation id).")] = None,
    wire_format: Annotated[
        WireFormat | None,
        typer.Option("--format", help="Wire form of the requests (default: json for --json files, else protobuf)."),
    ] = None,
    id_prefix: Annotated[str, typer.Option("--id-prefix", help="Prefix of generated correlation ids.")] = "",
    keep_ids: Annotated[
        bool, typer.Option("--keep-ids", help="Keep the ids written in a --json file instead of fresh ones.")
    ] = False,
    deadline_ms: Annotated[
        int | None,
        typer.Option("--deadline-ms", min=1, help="Deadline relative to sending: the deadline header is now + this."),
    ] = None,
    priority: Annotated[int | None, typer.Option("--priority", min=0, help="Value of the priority header.")] = None,
    length: Annotated[int, typer.Option("--length", min=1, help="Size of variable (-1) dimensions for --random.")] = 16,
    seed: Annotated[int | None, typer.Option("--seed", help="Random seed for --random (default: unseeded).")] = None,
) -> None:
    """Produce inference requests to a topology's input topic (or any topic).

    Each record gets a fresh correlation id (also its key, unless --key) and a
    sent-at-ms header, so `pipeline consume` can report end-to-end latency.
    Prints sent / acknowledged / failed counts; exit status 1 if any failed.
    `--json -` reads the requests from standard input.
    """
    from pipeline.contract.request import WireForm
    from pipeline.tools.sources import RecordBuilder, RecordOptions, describe_inputs, repeat

    sources = {
        "--json": json_file,
        "--npy": npy_file,
        "--wav": wav_file,
        "--random": random or None,
        "--audio": audio_file,
    }
    chosen = [flag for flag, value in sources.items() if value is not None]
    if len(chosen) != 1:
        raise ConfigError(
            "choose exactly one source: --json FILE, --npy FILE, --wav FILE, --audio FILE or --random"
            + (f" (got {', '.join(chosen)})" if chosen else "")
        )
    topology = topology_argument(topology_file, topology_option)
    if audio_file is not None:
        _produce_audio(topology, topic, lane, audio_file, chunk_ms, speed, chunk_wav, key, wire_format)
        return
    if keep_ids and json_file is None:
        raise ConfigError("--keep-ids applies to --json files only")
    target = load_target(topology, model=model)
    destination = target.input_topic(topic, lane)
    kafka = target.kafka()
    announce_endpoints(endpoints_text(kafka=kafka, target=target))
    templates, default_count = _templates(
        chosen[0], target, json_file or npy_file or wav_file, input_name, length, seed
    )
    total = default_count if count is None else count
    if wire_format is not None:
        form = WireForm(wire_format.value)
    else:  # a JSON file goes out as written; generated tensors as Triton's own protobuf
        form = WireForm.JSON if json_file is not None else WireForm.PROTOBUF
    builder = RecordBuilder(
        RecordOptions(form=form, id_prefix=id_prefix, keep_ids=keep_ids, key=key, priority=priority)
    )
    stream = iter(templates)
    first = next(stream)  # every source yields at least one request
    templates = itertools.chain([first], stream)
    shape = f" ({describe_inputs(first)})"
    pace = f" at {rate:g}/s" if rate else ""
    announce = f"producing {total} {form.value} request(s){shape} to {destination}{pace}"
    records = (builder.build(t) for t in repeat(templates, total))
    _report(asyncio.run(_send(records, destination, kafka, total, rate, deadline_ms, announce)))


def _produce_audio(
    topology: Path | None,
    topic: str | None,
    lane: str | None,
    path: Path,
    chunk_ms: float,
    speed: float,
    as_wav: bool,
    key: str | None,
    wire_format: WireFormat | None,
) -> None:
    """One stream: the file's chunks in order, paced at ``speed`` x real time."""
    import secrets

    from pipeline.contract.request import WireForm
    from pipeline.tools.sources import RecordBuilder, RecordOptions, audio_stream_requests

    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    stream = key or f"{path.stem}-{secrets.token_hex(3)}"
    templates, plan = audio_stream_requests(path, chunk_ms=chunk_ms, stream=stream, as_wav=as_wav)
    target = load_target(topology, model=None)
    destination = target.input_topic(topic, lane)
    announce_endpoints(endpoints_text(kafka=target.kafka(), target=target))
    form = WireForm(wire_format.value) if wire_format is not None else WireForm.PROTOBUF
    builder = RecordBuilder(RecordOptions(form=form, id_prefix=f"{stream}/", key=stream))
    rate = speed * 1000 / plan.chunk_ms if speed > 0 else 0.0
    pace = "as fast as possible" if speed == 0 else f"at {speed:g}x real time"
    announce = (
        f"streaming {path.name} as {stream!r}: {plan.chunks} chunks of {plan.chunk_ms:.1f} ms "
        f"({plan.chunk_samples} samples at {plan.sample_rate} Hz) to {destination}, {pace}"
    )
    records = [builder.build(t) for t in templates]
    _report(asyncio.run(_send(records, destination, target.kafka(), len(records), rate, None, announce)))


def _templates(
    source: str,
    target: Target,
    path: Path | None,
    input_name: str | None,
    length: int,
    seed: int | None,
) -> tuple[Iterable[RequestTemplate], int]:
    """The source's templates (a list, or an endless iterator for --random) and its default count."""
    from pipeline.tools import sources

    if source == "--json":
        assert path is not None
        loaded = json_requests(path)
        return loaded, len(loaded)
    if source == "--random":
        if target.model is None:
            raise ConfigError("--random needs a model: --topology FILE or --model NAME")
        return sources.random_requests(_describe(target), length=length, seed=seed), 100
    described = _describe(target) if target.model is not None else None
    assert path is not None
    if source == "--npy":
        return [sources.npy_request(path, input_name, described)], 1
    return [sources.wav_request(path, input_name, described)], 1


def json_requests(path: Path) -> list[RequestTemplate]:
    """:func:`pipeline.tools.sources.json_requests`, with ``-`` meaning standard input (as in
    kcat and most Unix tools). Standard input is read whole into a private temporary file,
    so the file reader's checks and line numbers apply; errors name ``<stdin>``."""
    import tempfile

    from pipeline.tools import sources

    if str(path) != "-":
        return sources.json_requests(path)
    text = sys.stdin.read()
    with tempfile.TemporaryDirectory(prefix="pipeline-stdin-") as folder:
        spooled = Path(folder) / "stdin.json"
        spooled.write_text(text, encoding="utf-8")
        try:
            return sources.json_requests(spooled)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(str(spooled), "<stdin>")) from None


def _describe(target: Target) -> ModelDescription:
    from pipeline.triton.admin import TritonAdmin

    assert target.model is not None
    with TritonAdmin(target.triton()) as admin:
        return admin.describe(target.model, target.model_version)


def _report(stats: ProduceStats) -> None:
    """Print the summary; exit 130 after a signal, fail (exit 1) if any record failed."""
    from pipeline.tools.render import produce_summary_lines

    for line in produce_summary_lines(stats):
        print(line)
    sys.stdout.flush()
    if stats.interrupted:
        raise SystemExit(130)
    if stats.failed:
        raise PipelineError(f"{stats.failed} of {stats.sent} record(s) failed: {stats.first_error}")


async def _send(
    records: Iterable[Record],
    topic: str,
    kafka: KafkaSettings,
    total: int,
    rate: float,
    deadline_ms: int | None,
    announce: str,
) -> ProduceStats:
    """Send with a progress display; ``announce`` is printed once the broker has answered."""
    from pipeline.tools.producer import SendOptions, produce
    from pipeline.tools.signals import stop_on_signals

    # aiokafka logs connection failures itself; the one-line error below says it once.
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())
    stop = asyncio.Event()
    with stop_on_signals(stop), _ProgressReporter(total) as progress:
        return await produce(
            records,
            topic=topic,
            settings=kafka,
            options=SendOptions(rate=rate, deadline_ms=deadline_ms),
            planned=total,
            on_progress=progress.update,
            on_connected=lambda: console_err.print(announce, highlight=False, markup=False, soft_wrap=True),
            stop=stop,
        )


class _ProgressReporter:
    """A rich progress bar when stderr is a terminal; else a plain line every few seconds."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.live = console_err.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last = time.monotonic()

    def __enter__(self) -> Self:
        if self.live:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("sending"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("acked {task.fields[acked]}, failed {task.fields[failed]}, {task.fields[rate]:.0f}/s"),
                TimeElapsedColumn(),
                console=console_err,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("send", total=self.total, acked=0, failed=0, rate=0.0)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, stats: ProduceStats) -> None:
        now = time.monotonic()
        if self._progress is not None and self._task is not None:
            if now - self._last >= 0.05 or stats.sent == self.total:
                self._last = now
                self._progress.update(
                    self._task,
                    completed=stats.sent,
                    acked=stats.acknowledged,
                    failed=stats.failed,
                    rate=stats.rate,
                )
        elif now - self._last >= PLAIN_PROGRESS_EVERY_S:
            from pipeline.tools.render import produce_progress_line

            self._last = now
            print(produce_progress_line(stats), file=sys.stderr, flush=True)
