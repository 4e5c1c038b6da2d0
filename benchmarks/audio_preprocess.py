"""Audio preprocessing micro-benchmark: the DALI stage against numpy/scipy, one chunk at a time.

    .venv/bin/python -m benchmarks.audio_preprocess [--repeats R] [--batch B] [--threads T]
                                                    [--device auto|cpu|gpu] [--json out.json]

The same chunks go through every method (made once, deterministic: tones and
noise; the cost does not depend on the content):

==============  ===============================================================
chunks-22k      256 x 32 ms (706 samples) 22.05 kHz mono 16-bit WAV: streaming chunks
clips-22k       64 x 1 s 22.05 kHz mono 16-bit WAV
clips-44k-st    64 x 1 s 44.1 kHz stereo 16-bit WAV
pcm-8k          256 x 32 ms 8 kHz INT16 tensors (telephony, upsampled)
==============  ===============================================================

Methods, each from the chunk as received (bytes or tensor) to 16 kHz mono float32:

(a) ``dali Nt``       ``AudioInput`` (validation, canonical WAV) + ``AudioPreprocessor.process``
                      in batches of B on N DALI threads (the stage's path; anti-aliasing on);
                      on the CPU also ``dali 1t``, one thread, as scipy uses one core
(b) ``scipy``         numpy decode, channel mean, ``scipy.signal.resample_poly``, clip --
                      one chunk after the other: the baseline the ratio is against
(c) ``numpy-kernel``  the kernel-matched reference (the tests' oracle), one by one
(d) ``librosa``       ``librosa.resample`` one by one, only when librosa is installed

Each method runs once to warm up, then the methods take turns, R timed runs
each, so the machine's other load falls on all of them alike. Throughput =
chunks / median seconds; audio-s/s = seconds of input audio per second;
"vs scipy" is the ratio of median times to (b)'s, "best vs best" the ratio of
the fastest runs (less sensitive to a noisy machine). Compare ratios within one
run, not absolute numbers across runs. Every DALI output is checked against (c)
(max abs error must be < 2e-5, else exit 1), so a fast wrong answer cannot pass.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from benchmarks import cli
from benchmarks.report import case_table
from pipeline.audio import AudioInput, DecodedAudio, decode_pcm, decode_wav
from pipeline.audio.dali_preprocess import AudioPreprocessor
from pipeline.audio.reference import polyphase_resample, reference_batch
from pipeline.audio.wav import WAVE_FORMAT_PCM, canonical_wav

TARGET = 16_000


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    chunks: list[bytes | np.ndarray]
    rate: int

    @property
    def audio_seconds(self) -> float:
        return sum(_frames(c) for c in self.chunks) / self.rate


@dataclass
class Row:
    workload: str
    method: str
    seconds: float  # median
    best_seconds: float
    chunks_per_s: float  # from the median
    audio_s_per_s: float
    ratio: float | None = None  # median throughput / scipy's median throughput
    best_ratio: float | None = None  # the same from the best runs
    max_error: float | None = None


def _frames(chunk: bytes | np.ndarray) -> int:
    if isinstance(chunk, np.ndarray):
        return len(chunk)
    return AudioInput(wav=chunk).info.frames


def _signal(frames: int, channels: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(frames) / rate
    base = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3100 * t)
    noise = 0.05 * rng.standard_normal((frames, channels))
    return (np.clip(base[:, None] + noise, -1, 1) * 32767).astype("<i2")


def _wav(samples: np.ndarray, rate: int) -> bytes:
    return canonical_wav(WAVE_FORMAT_PCM, samples.shape[1], rate, 16, samples.tobytes())


def workloads() -> list[Workload]:
    rng = np.random.default_rng(2024)
    return [
        Workload(
            "chunks-22k",
            "256 x 32 ms, 22.05 kHz mono WAV",
            [_wav(_signal(706, 1, 22_050, rng), 22_050) for _ in range(256)],
            22_050,
        ),
        Workload(
            "clips-22k",
            "64 x 1 s, 22.05 kHz mono WAV",
            [_wav(_signal(22_050, 1, 22_050, rng), 22_050) for _ in range(64)],
            22_050,
        ),
        Workload(
            "clips-44k-st",
            "64 x 1 s, 44.1 kHz stereo WAV",
            [_wav(_signal(44_100, 2, 44_100, rng), 44_100) for _ in range(64)],
            44_100,
        ),
        Workload(
            "pcm-8k",
            "256 x 32 ms, 8 kHz INT16 tensors",
            [_signal(256, 1, 8_000, rng)[:, 0] for _ in range(256)],
            8_000,
        ),
    ]


def to_input(chunk: bytes | np.ndarray, rate: int) -> AudioInput:
    if isinstance(chunk, np.ndarray):
        return AudioInput(pcm=chunk, sample_rate=rate)
    return AudioInput(wav=chunk)


# --------------------------------------------------------------------------- methods
def run_dali(pre: AudioPreprocessor, batch: int) -> Callable[[Workload], list[np.ndarray]]:
    def run(work: Workload) -> list[np.ndarray]:
        items = [to_input(c, work.rate) for c in work.chunks]
        out: list[np.ndarray] = []
        for start in range(0, len(items), batch):
            out += pre.process(items[start : start + batch])
        return out

    return run


def decode(chunk: bytes | np.ndarray, rate: int) -> DecodedAudio:
    """numpy decoding, without the validation an :class:`AudioInput` adds (the baselines' cost)."""
    return decode_pcm(chunk, rate) if isinstance(chunk, np.ndarray) else decode_wav(chunk)


def run_scipy(work: Workload) -> list[np.ndarray]:
    out = []
    for chunk in work.chunks:
        decoded = decode(chunk, work.rate)
        mono = decoded.mono()
        out.append(np.clip(polyphase_resample(mono, decoded.info.sample_rate, TARGET), -1, 1))
    return out


def run_kernel(work: Workload) -> list[np.ndarray]:
    return reference_batch([to_input(c, work.rate) for c in work.chunks], TARGET)


def librosa_method() -> Callable[[Workload], list[np.ndarray]] | None:
    try:
        import librosa  # optional: not a dependency of the project
    except ImportError:
        return None

    def run(work: Workload) -> list[np.ndarray]:
        out = []
        for chunk in work.chunks:
            decoded = decode(chunk, work.rate)
            out.append(
                librosa.resample(decoded.mono(), orig_sr=decoded.info.sample_rate, target_sr=TARGET)
            )
        return out

    return run


def time_methods(
    methods: Sequence[tuple[str, Callable[[Workload], list[np.ndarray]]]],
    work: Workload,
    repeats: int,
) -> dict[str, tuple[list[float], list[np.ndarray]]]:
    """Warm every method up once (keeping its outputs), then time them in turns.

    Taking turns spreads the machine's other load over all methods alike, so the
    ratios hold even when the absolute times drift.
    """
    outputs = {name: run(work) for name, run in methods}
    times: dict[str, list[float]] = {name: [] for name, _ in methods}
    for _ in range(repeats):
        for name, run in methods:
            start = time.perf_counter()
            run(work)
            times[name].append(time.perf_counter() - start)
    return {name: (times[name], outputs[name]) for name, _ in methods}


def max_error(outputs: Sequence[np.ndarray], references: Sequence[np.ndarray]) -> float:
    if len(outputs) != len(references):
        return float("inf")
    worst = 0.0
    for out, ref in zip(outputs, references, strict=True):
        if out.shape != ref.shape:
            return float("inf")
        worst = max(worst, float(np.max(np.abs(out - ref))))
    return worst


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser("audio_preprocess", __doc__)
    p.add_argument("--repeats", type=int, default=9, help="timed runs per method")
    p.add_argument("--batch", type=int, default=64, help="chunks per DALI run (max_batch_size)")
    p.add_argument("--threads", type=int, default=2, help="DALI CPU threads")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--json", type=Path, help="also write the rows here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=120)
    pre = AudioPreprocessor(
        target_rate=TARGET, device=args.device, max_batch_size=args.batch, num_threads=args.threads
    )
    methods: list[tuple[str, Callable[[Workload], list[np.ndarray]]]] = [
        (f"dali {args.threads}t", run_dali(pre, args.batch))
    ]
    if pre.device == "cpu" and args.threads != 1:
        # scipy uses one core: show DALI on one thread too, for a per-core comparison.
        single = AudioPreprocessor(TARGET, device="cpu", max_batch_size=args.batch, num_threads=1)
        methods.append(("dali 1t", run_dali(single, args.batch)))
    methods += [("scipy", run_scipy), ("numpy-kernel", run_kernel)]
    librosa_run = librosa_method()
    if librosa_run is not None:
        methods.append(("librosa", librosa_run))
    import nvidia.dali

    console.print(
        f"DALI {nvidia.dali.__version__} on [bold]{pre.device}[/bold], batch {args.batch}, "
        f"{args.threads} DALI threads; {os.cpu_count()} CPUs ({platform.machine()}); "
        f"Python {sys.version.split()[0]}; {args.repeats} timed runs per method, taken in turns"
    )
    if librosa_run is None:
        console.print("librosa: not installed, skipped")

    rows: list[Row] = []
    failures = []
    for work in workloads():
        measured = time_methods(methods, work, args.repeats)
        scipy_times = measured["scipy"][0]
        reference = measured["numpy-kernel"][1]
        for name, (times, outputs) in measured.items():
            median, best = statistics.median(times), min(times)
            row = Row(
                work.name,
                name,
                median,
                best,
                len(work.chunks) / median,
                work.audio_seconds / median,
                statistics.median(scipy_times) / median,
                min(scipy_times) / best,
            )
            if name.startswith("dali"):
                row.max_error = max_error(outputs, reference)
                if not row.max_error < 2e-5:
                    failures.append(
                        f"{work.name}: {name} differs from the reference by {row.max_error:.2e}"
                    )
            rows.append(row)

    columns: tuple[str, ...] = ("workload", "method", "median", "best", "chunks/s", "audio-s/s")
    columns += ("vs scipy", "best vs best", "max err")
    table = case_table(
        columns, left=("workload", "method"), title="audio preprocessing -> 16 kHz mono float32"
    )
    for row in rows:
        table.add_row(
            row.workload,
            row.method,
            f"{row.seconds * 1e3:.1f} ms",
            f"{row.best_seconds * 1e3:.1f} ms",
            f"{row.chunks_per_s:,.0f}",
            f"{row.audio_s_per_s:,.0f}",
            f"{row.ratio:.1f}x" if row.ratio is not None else "-",
            f"{row.best_ratio:.1f}x" if row.best_ratio is not None else "-",
            f"{row.max_error:.1e}" if row.max_error is not None else "",
        )
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    for failure in failures:
        console.print(f"[red]FAILED[/red] {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
