"""The RIFF/WAVE container: find the format and the sample bytes, and write canonical headers.

This is the project's one WAV reader: the DALI stage, the numpy reference and
``pipeline produce --wav`` (:mod:`pipeline.tools.audio`) all read through it.

Why our own parser rather than a library: measured in November 2026 (CPython
3.11.7, the project's interpreter; ``requires-python >= 3.10``):

- :mod:`wave` refuses ``WAVE_FORMAT_IEEE_FLOAT`` files (``wave.Error: unknown
  format: 3``; format tag 3 is the default of many audio tools) and every
  ``WAVE_FORMAT_EXTENSIBLE`` file (``unknown format: 65534``; the format's
  specification asks for it above 16 bits or 2 channels). Python 3.12 reads EXTENSIBLE with a PCM
  sub-format only; float reading arrives in 3.15 (CPython gh-60729).
- On 20,000 damaged copies of a valid 16-bit file (cut short, header bytes
  overwritten), ``wave`` raised three exception types (``wave.Error`` 10,716,
  ``RuntimeError`` with an empty message 1,913, ``EOFError`` 49) and accepted
  7,322, of which 6,702 silently returned fewer samples than their header
  declares. This parser raised :class:`~pipeline.audio.errors.AudioError` on
  19,869 and accepted 131, all whole; a stage must dead-letter a bad message
  with one exception type and a reason, and the fuzz tests in
  ``tests/unit/test_audio_preprocess.py`` hold it to that.
- Speed is no reason either way: a 1 s 16 kHz PCM16 chunk takes 6.7 us to
  open with ``wave`` (header only) and 2.7 us with :func:`parse_wav`, which
  returns offsets into the payload instead of copying the samples.

``soundfile`` (libsndfile) would read all of these but is not a dependency,
nor is ``scipy`` outside the tests. A chunk walker of forty lines handles every
layout we accept. (Method: ``wave.open`` + ``readframes`` and :func:`parse_wav`
on the same bytes; the damaged copies cut 0..120 bytes off the end and set up
to 6 random bytes among the first 60, ``random.Random(0)``; times are the best
of 5 x 2,000 calls on the project's 2-core VM.)

Why we *write* WAV too: the DALI stage feeds every chunk to DALI's decoder as
a canonical 44-byte-header WAV that this module wrote (see
:func:`canonical_wav`). The decoder (libsndfile) then only ever sees headers
we know it reads, so one odd file can never fail a whole batch, and raw PCM
tensors travel the same decode path as files.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pipeline.audio.errors import AudioError

WAVE_FORMAT_PCM = 0x0001
WAVE_FORMAT_IEEE_FLOAT = 0x0003
WAVE_FORMAT_EXTENSIBLE = 0xFFFE

_RIFF = struct.Struct("<4sI4s")
_CHUNK = struct.Struct("<4sI")
_FMT = struct.Struct("<HHIIHH")  # format tag, channels, rate, byte rate, block align, bits
_EXTENSIBLE = struct.Struct("<HHI")  # cbSize, valid bits per sample, channel mask (then the GUID)
_EXTENSIBLE_FMT_SIZE = _FMT.size + _EXTENSIBLE.size + 16  # 40 bytes, the GUID last
#: Bytes 2..15 of every KSDATAFORMAT_SUBTYPE_* GUID; bytes 0..1 hold the format tag.
_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")
#: The size of the header :func:`wav_header` writes.
HEADER_SIZE = 44
#: A ``data`` size this large is the placeholder a writer that streams (``espeak-ng --stdout``,
#: ``ffmpeg`` to a pipe) leaves for "unknown": the data runs to the end of the payload.
#: No message is 2 GiB, so a real size never reaches it; a smaller one that overruns is truncation.
STREAMING_SIZE = 0x7FFF0000
#: Chunks allowed before ``data``: real files carry a few (LIST, fact, bext, JUNK, ...);
#: the cap keeps a hostile payload of a million empty chunks from costing a million iterations.
MAX_CHUNKS = 64

_KNOWN_TAGS = {
    0x0002: "MS ADPCM",
    0x0006: "A-law",
    0x0007: "mu-law",
    0x0011: "IMA ADPCM",
    0x0050: "MPEG",
    0x0055: "MP3",
}


@dataclass(frozen=True)
class WavLayout:
    """What a WAV header says, with the sample bytes located as ``data[offset:offset + size]``."""

    format_tag: int  # WAVE_FORMAT_PCM or WAVE_FORMAT_IEEE_FLOAT (EXTENSIBLE resolved)
    channels: int
    sample_rate: int
    bits: int  # container bits per sample
    data_offset: int
    data_size: int

    @property
    def block_align(self) -> int:
        return self.channels * self.bits // 8


def parse_wav(data: bytes | bytearray | memoryview) -> WavLayout:
    """Walk the RIFF chunks up to ``data``; check the container, not the limits.

    Raises :class:`AudioError` (``not-wav``, ``truncated``, ``unsupported-format``,
    ``no-samples``) and nothing else, whatever the bytes.
    """
    size = len(data)
    if size < _RIFF.size:
        raise AudioError(f"{size} bytes is shorter than a RIFF header", kind="not-wav")
    riff, _riff_size, wave = _RIFF.unpack_from(data, 0)
    if riff == b"RIFX" or riff == b"RF64":
        raise AudioError(f"{riff.decode()} containers are not supported", kind="unsupported-format")
    if riff != b"RIFF" or wave != b"WAVE":
        raise AudioError("not a RIFF/WAVE file", kind="not-wav")
    # The RIFF size field is ignored: writers that stream get it wrong; the chunks are checked.
    fmt: tuple[int, int, int, int] | None = None
    offset = _RIFF.size
    for _ in range(MAX_CHUNKS):
        if offset + _CHUNK.size > size:
            missing = "data" if fmt is not None else "fmt "
            raise AudioError(f"no {missing!r} chunk before the end of the file", kind="truncated")
        chunk_id, chunk_size = _CHUNK.unpack_from(data, offset)
        body = offset + _CHUNK.size
        if chunk_id == b"fmt ":
            if fmt is not None:
                raise AudioError("two 'fmt ' chunks", kind="unsupported-format")
            if body + chunk_size > size:
                raise AudioError("the 'fmt ' chunk is cut short", kind="truncated")
            fmt = _parse_fmt(data, body, chunk_size)
        elif chunk_id == b"data":
            if fmt is None:
                raise AudioError("'data' chunk before the 'fmt ' chunk", kind="unsupported-format")
            if body + chunk_size > size:
                if chunk_size < STREAMING_SIZE:
                    raise AudioError(
                        f"the 'data' chunk declares {chunk_size} bytes but {size - body} follow",
                        kind="truncated",
                    )
                chunk_size = (
                    size - body
                )  # a streaming writer's placeholder: the data runs to the end
            tag, channels, rate, bits = fmt
            layout = WavLayout(tag, channels, rate, bits, body, chunk_size)
            if chunk_size % layout.block_align:
                raise AudioError(
                    f"{chunk_size} data bytes is not a whole number of "
                    f"{layout.block_align}-byte frames",
                    kind="truncated",
                )
            return layout
        offset = body + chunk_size + (chunk_size & 1)  # chunks are padded to an even size
    raise AudioError(f"more than {MAX_CHUNKS} chunks before 'data'", kind="unsupported-format")


def _parse_fmt(
    data: bytes | bytearray | memoryview, body: int, size: int
) -> tuple[int, int, int, int]:
    """(format tag, channels, rate, bits) for the sample formats we decode, else AudioError."""
    if size < _FMT.size:
        raise AudioError(f"'fmt ' chunk of {size} bytes (16 needed)", kind="unsupported-format")
    tag, channels, rate, _byte_rate, block_align, bits = _FMT.unpack_from(data, body)
    if tag == WAVE_FORMAT_EXTENSIBLE:
        if size < _EXTENSIBLE_FMT_SIZE:
            raise AudioError(
                "WAVE_FORMAT_EXTENSIBLE header is cut short", kind="unsupported-format"
            )
        _cb_size, valid_bits, _mask = _EXTENSIBLE.unpack_from(data, body + _FMT.size)
        guid = bytes(data[body + 24 : body + 40])
        if guid[2:] != _GUID_TAIL:
            raise AudioError("unknown WAVE_FORMAT_EXTENSIBLE sub-format", kind="unsupported-format")
        if valid_bits > bits:
            raise AudioError(
                f"{valid_bits} valid bits in {bits}-bit samples", kind="unsupported-format"
            )
        tag = int.from_bytes(guid[:2], "little")
    if tag == WAVE_FORMAT_PCM:
        if bits not in (8, 16, 24, 32):
            raise AudioError(
                f"{bits}-bit integer PCM is not supported (8/16/24/32)", kind="unsupported-format"
            )
    elif tag == WAVE_FORMAT_IEEE_FLOAT:
        if bits != 32:
            raise AudioError(
                f"{bits}-bit float is not supported (32 only)", kind="unsupported-format"
            )
    else:
        name = _KNOWN_TAGS.get(tag, "compressed or unknown")
        raise AudioError(
            f"format tag {tag:#06x} ({name}) is not supported", kind="unsupported-format"
        )
    if channels == 0:
        raise AudioError("zero channels", kind="no-samples")
    if block_align != channels * bits // 8:
        raise AudioError(
            f"block align {block_align} does not match {channels} x {bits}-bit samples",
            kind="unsupported-format",
        )
    return tag, channels, rate, bits


def wav_header(
    format_tag: int, channels: int, sample_rate: int, bits: int, data_size: int
) -> bytes:
    """The canonical 44-byte header: RIFF, a 16-byte ``fmt `` chunk, the ``data`` chunk header."""
    block_align = channels * bits // 8
    riff_size = 4 + (_CHUNK.size + _FMT.size) + _CHUNK.size + data_size + (data_size & 1)
    return b"".join(
        (
            _RIFF.pack(b"RIFF", riff_size, b"WAVE"),
            _CHUNK.pack(b"fmt ", _FMT.size),
            _FMT.pack(
                format_tag, channels, sample_rate, sample_rate * block_align, block_align, bits
            ),
            _CHUNK.pack(b"data", data_size),
        )
    )


def canonical_wav(
    format_tag: int, channels: int, sample_rate: int, bits: int, payload: bytes | memoryview
) -> bytes:
    """``payload`` (little-endian interleaved samples) behind a canonical header."""
    size = memoryview(payload).nbytes
    pad = b"\0" if size & 1 else b""
    return b"".join((wav_header(format_tag, channels, sample_rate, bits, size), payload, pad))


def is_canonical(data: bytes, layout: WavLayout) -> bool:
    """True when ``data`` is what :func:`canonical_wav` would write (so it needs no copy)."""
    expected = wav_header(
        layout.format_tag, layout.channels, layout.sample_rate, layout.bits, layout.data_size
    )
    end = HEADER_SIZE + layout.data_size + (layout.data_size & 1)
    return layout.data_offset == HEADER_SIZE and len(data) == end and data[:HEADER_SIZE] == expected
