"""A sequence stream through a topology (``topologies/audio.yaml``): chunks in, results out.

The session numbers the chunks (``chunk_index``), sets Triton's ``sequence_start`` on
the first and ``sequence_end`` on the one sent with ``last=True``, keys every record by
the stream key (one partition, so the stage sees them in order), and builds each
chunk exactly as ``pipeline produce --audio`` does
(:func:`pipeline.tools.sources.audio_chunk`). Its results (``chunk``, ``segment``,
``summary`` and ``gap`` records, all keyed by the stream) come back through the client's
reply topic; :meth:`StreamSession.results` ends after the stream's final one.

Chunks carry no ``deadline``: a chunk dead-lettered for lateness would leave a gap in
the stream. The session's ``timeout`` bounds the wait for each next result instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

import numpy as np
from typing_extensions import Self

from pipeline.client.errors import RequestDeadLettered, RequestTimedOut
from pipeline.client.result import InferResult, text_headers
from pipeline.client.waiters import Waiters
from pipeline.contract.records import Record
from pipeline.contract.request import WireForm, encode_request
from pipeline.tools.decoding import Consumed
from pipeline.tools.sources import audio_chunk


class StreamOwner(Protocol):
    """What a session uses of its :class:`~pipeline.client.client.Client`."""

    @property
    def form(self) -> WireForm: ...

    @property
    def stream_summary(self) -> bool: ...

    @property
    def reply_headers(self) -> list[tuple[str, bytes]]: ...

    @property
    def waiters(self) -> Waiters: ...

    def next_id(self) -> str: ...

    async def send(self, record: Record) -> None: ...


class StreamSession:
    """One stream key of one client; open with ``async with client.stream(key) as s``."""

    def __init__(self, client: StreamOwner, key: str, *, timeout: float | None) -> None:
        self.client = client
        self.key = key
        self.timeout = timeout
        self.sent = 0
        self._last_index: int | None = None
        self._finished = False
        self._queue: asyncio.Queue[Consumed] | None = None

    async def __aenter__(self) -> Self:
        self._queue = self.client.waiters.open_stream(self.key.encode())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.client.waiters.close_stream(self.key.encode())

    async def send(
        self, chunk: np.ndarray, *, last: bool = False, sample_rate: int = 16_000, as_wav: bool = False
    ) -> str:
        """Send the next chunk (``[frames]`` or ``[frames, channels]``, INT16 or float in [-1, 1]);
        ``last`` ends the stream. Returns the chunk's correlation id once the broker has it."""
        if self._last_index is not None:
            raise ValueError(f"stream {self.key!r} has already ended")
        index = self.sent
        template = audio_chunk(chunk, index=index, stream=self.key, end=last, sample_rate=sample_rate, as_wav=as_wav)
        correlation_id = f"{self.client.next_id()}/{index}"
        record = encode_request(
            template.inputs, correlation_id=correlation_id, form=self.client.form,
            datatypes=template.datatypes, parameters=template.parameters, key=self.key,
            extra_headers=self.client.reply_headers,
        )
        await self.client.send(record)
        self.sent += 1
        if last:
            self._last_index = index
        return correlation_id

    async def results(self) -> AsyncIterator[InferResult]:
        """The stream's results as they come, until its final one (the ``summary`` when the
        topology post-processes, else the last chunk's result). A dead-lettered chunk raises
        :class:`RequestDeadLettered`; no result within ``timeout`` raises :class:`RequestTimedOut`."""
        if self._queue is None:
            raise RuntimeError("use 'async with client.stream(key) as s' first")
        while not self._finished:
            try:
                consumed = await asyncio.wait_for(self._queue.get(), self.timeout)
            except asyncio.TimeoutError:
                raise RequestTimedOut(f"stream {self.key}", self.timeout or 0.0) from None
            if consumed.dead_letter is not None:
                headers = text_headers(consumed.headers)
                raise RequestDeadLettered(consumed.correlation_id or "", consumed.dead_letter, headers)
            result = InferResult.of(consumed)
            self._finished = self._is_final(result)
            yield result

    def _is_final(self, result: InferResult) -> bool:
        if self._last_index is None:
            return False
        if self.client.stream_summary:
            return result.result_type == "summary"
        return result.result_type in (None, "chunk") and result.chunk_index == self._last_index
