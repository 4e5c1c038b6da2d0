"""The one exception bad audio raises.

A chunk of audio arrives in one Kafka message; when it cannot be turned into
samples the stage dead-letters that one message and carries on. So every
check in this package raises :class:`AudioError` and nothing else: it is a
:class:`~pipeline.contract.errors.BadRequest` (``malformed-request``), the one
type a stage already catches to dead-letter a record, and its ``kind`` says
which rule was broken, for tests, logs and metric labels.
"""

from __future__ import annotations

from typing import Literal

from pipeline.contract.errors import BadRequest, ErrorClass

AudioErrorKind = Literal[
    "not-wav",  # not a RIFF/WAVE container at all
    "truncated",  # a chunk declares more bytes than the payload holds, or ends mid-frame
    "unsupported-format",  # a real WAV, but a sample format / layout we do not decode
    "no-samples",  # zero frames or zero channels
    "bad-rate",  # sample rate missing, not an integer, or outside the allowed range
    "too-long",  # longer than the per-chunk cap
    "bad-tensor",  # a PCM tensor with the wrong dtype, rank or shape
    "non-finite",  # NaN or infinity in floating-point samples
]


class AudioError(BadRequest):
    """Audio that cannot be decoded: ``kind`` is the rule, ``reason`` a one-line explanation.

    ``index`` is set when the error is about one item of a batch.
    """

    def __init__(
        self, reason: str, *, kind: AudioErrorKind = "unsupported-format", index: int | None = None
    ) -> None:
        self.kind: AudioErrorKind = kind
        self.index = index
        prefix = f"audio item {index}: " if index is not None else "audio: "
        super().__init__(ErrorClass.MALFORMED_REQUEST, prefix + reason)
