"""Reference Silero VAD run in-process, and test speech made with espeak-ng.

Why: the Triton ``silero_vad`` model must give exactly what the vendored ONNX file
gives when run chunk by chunk the way silero's own ``OnnxWrapper`` does it
(input = 64 samples of context + 512 new samples; next context = last 64 samples
of that input; state and context start at zero). This module is that reference,
without the ``silero-vad`` package (which requires torch).
"""

from __future__ import annotations

import subprocess
import tempfile
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO_ROOT = Path(__file__).resolve().parents[2]
VAD_ONNX = REPO_ROOT / "sample_models" / "silero_vad" / "1" / "silero_vad.onnx"
SAMPLE_RATE = 16000
CHUNK = 512
CONTEXT = 64
CHUNK_SECONDS = CHUNK / SAMPLE_RATE  # 0.032 s


@dataclass
class VadStream:
    """One stream's recurrent state; ``step`` feeds one 512-sample chunk."""

    session: ort.InferenceSession
    state: np.ndarray = field(default_factory=lambda: np.zeros((2, 128), np.float32))
    context: np.ndarray = field(default_factory=lambda: np.zeros(CONTEXT, np.float32))

    def step(self, chunk: np.ndarray) -> float:
        x = np.concatenate([self.context, chunk.astype(np.float32)])[None, :]
        prob, state_n = self.session.run(
            ["output", "stateN"],
            {"input": x, "state": self.state[:, None, :], "sr": np.array(SAMPLE_RATE, np.int64)},
        )
        self.state = np.asarray(state_n[:, 0, :], np.float32)
        self.context = x[0, -CONTEXT:].copy()
        return float(prob[0, 0])

    def run(self, chunks: np.ndarray) -> np.ndarray:
        """Probabilities for ``chunks`` [n, 512], continuing from the current state."""
        return np.array([self.step(c) for c in chunks], np.float32)


def vad_session(path: Path = VAD_ONNX) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def to_chunks(audio: np.ndarray) -> np.ndarray:
    """[n, 512] float32, the tail zero-padded to a whole chunk (as silero's audio_forward does)."""
    pad = (-len(audio)) % CHUNK
    return np.pad(audio.astype(np.float32), (0, pad)).reshape(-1, CHUNK)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono 16-bit PCM WAV to float32 in [-1, 1] and its sample rate."""
    with wave.open(str(path), "rb") as wav:
        assert wav.getsampwidth() == 2 and wav.getnchannels() == 1, "expected mono 16-bit PCM"
        rate = wav.getframerate()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0, rate


def espeak(text: str) -> tuple[np.ndarray, int]:
    """Speech for ``text`` from espeak-ng (22,050 Hz mono on Debian): audio and its rate."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(out), text], check=True, capture_output=True)
        return read_wav(out)


def speech_with_silence(
    text: str = "The quick brown fox jumps over the lazy dog.", pad_s: float = 1.0
) -> np.ndarray:
    """16 kHz float32: ``pad_s`` of silence, espeak-ng speech, ``pad_s`` of silence.

    Speech therefore starts at ``pad_s`` seconds (espeak-ng trims its own lead-in to a few ms).
    """
    from scipy.signal import resample_poly

    audio, rate = espeak(text)
    assert rate == 22050, f"espeak-ng wrote {rate} Hz, expected 22050"
    speech = resample_poly(audio, 160, 441).astype(np.float32)  # 22,050 Hz -> 16,000 Hz
    silence = np.zeros(int(pad_s * SAMPLE_RATE), np.float32)
    return np.concatenate([silence, speech, silence])
