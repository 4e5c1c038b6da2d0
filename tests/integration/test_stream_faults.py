"""A stream survives what goes wrong with some of its chunks (issue: every record reaches an outcome).

- The issue's probe: 40 chunks through DALI and the sequence stage, chunk 10 with an
  INT16 value out of range. Chunk 10 is dead-lettered by the DALI stage; the sequence
  stage skips it (a ``gap`` result names it) and chunks 11–39 get their results, equal
  to an offline run over the audio without chunk 10.
- A NaN chunk is refused by the sequence stage itself, and the stream goes on.
- Chunk 0 with sequence_start on a key whose stream ended starts the key's next stream;
  a replay of the ended stream's chunk 0 is dropped (counted), not restarted.

A corrupt checkpoint of a stream is part of the fault campaign, with figures
(tests/integration/test_triton_faults.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.contract.records import Record, read_dead_letter
from tests.helpers.kafka_io import Collected, header, produce
from tests.helpers.streams import AUDIO_STAGES, SEQUENCE_STAGE, chunk_records, gather, utterance
from tests.helpers.topology_process import TopologyFiles, collect_outputs, pipeline_process, write_topology
from tests.helpers.vad_reference import CHUNK, VadStream, to_chunks, vad_session

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]


def _pcm_records(key: str, pieces: list[np.ndarray]) -> list[Record]:
    """INT16 PCM chunks as JSON requests (so a test can write a value INT16 cannot hold)."""
    return chunk_records(key, pieces, form="json", sample_rate=16000)


def _run_until_summaries(
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    tmp_path: Path,
    topo: TopologyFiles,
    records: list[Record],
    *,
    summaries: int = 1,
    timeout: float,
) -> Collected:
    """Produce ``records``, run the pipeline until ``summaries`` summary results, stop it cleanly."""
    with pipeline_process(topo, cli_env, tmp_path) as worker:
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, records))
        out = collect_outputs(
            kafka_bootstrap,
            topo,
            lambda rs: sum(header(r, "result-type") == "summary" for r in rs) >= summaries,
            timeout=timeout,
        )
        assert worker.terminate() == 0
    return out


def _out_of_range(record: Record) -> Record:
    """The same JSON request with one INT16 sample of 40000."""
    body = json.loads(record.value)
    body["inputs"][0]["data"][0] = 40000
    return dataclasses.replace(record, value=json.dumps(body).encode())


def _probabilities(results: dict[int, np.ndarray], indices: list[int]) -> np.ndarray:
    return np.concatenate([results[i] for i in indices])


def test_one_bad_chunk_costs_only_that_chunk(kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path) -> None:
    pcm = np.clip(np.round(utterance(0) * 32768), -32768, 32767).astype("<i2")
    pieces = [pcm[i * CHUNK : (i + 1) * CHUNK] for i in range(40)]
    assert all(len(p) == CHUNK for p in pieces), "the utterance is long enough for 40 chunks"
    records = _pcm_records("probe", pieces)
    records[10] = _out_of_range(records[10])
    topo = write_topology(tmp_path, partitions=2, stages=AUDIO_STAGES)
    out = _run_until_summaries(kafka_bootstrap, cli_env, tmp_path, topo, records, timeout=90)
    dead = out.on(topo.dead_letter_topic)
    letters = [read_dead_letter(r.headers) for r in dead]
    assert [d.stage for d in letters] == ["preprocess"], letters
    assert dead[0].value == records[10].value, "the bad chunk, byte for byte"
    results = out.on(topo.result_topic)
    gaps = [r for r in results if header(r, "result-type") == "gap"]
    assert len(gaps) == 1
    stream = gather([r for r in results if header(r, "result-type") != "gap"])["probe"]
    assert sorted(stream.chunks) == [i for i in range(40) if i != 10], "chunks 0-9 and 11-39 have results"
    assert stream.chunk_order == sorted(stream.chunk_order)
    # Equal to an offline run over the audio without chunk 10 (the stream went on without it).
    audio = np.concatenate([p for i, p in enumerate(pieces) if i != 10]).astype(np.float32) / 32768.0
    want = VadStream(vad_session()).run(to_chunks(audio))
    np.testing.assert_allclose(_probabilities(stream.chunks, sorted(stream.chunks)), want, atol=1e-5)
    assert stream.summary is not None and stream.summary["chunks"] == 40
    print(f"40 chunks, chunk 10 bad: {len(stream.chunks)} chunk results, 1 gap result, {len(letters)} dead letter")


def test_nan_chunk_is_refused_by_the_sequence_stage_and_the_stream_goes_on(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    audio = utterance(1)
    pieces = [audio[i * CHUNK : (i + 1) * CHUNK] for i in range(12)]
    bad = pieces[4].copy()
    bad[7] = np.nan
    records = chunk_records("nan", [bad if i == 4 else piece for i, piece in enumerate(pieces)])
    topo = write_topology(tmp_path, partitions=1, stages=[{**SEQUENCE_STAGE, "gap_timeout_s": 1}])
    out = _run_until_summaries(kafka_bootstrap, cli_env, tmp_path, topo, records, timeout=60)
    letters = [read_dead_letter(r.headers) for r in out.on(topo.dead_letter_topic)]
    assert [(d.stage, d.error_class) for d in letters] == [("vad", "malformed-request")]
    assert "NaN" in letters[0].reason
    stream = gather(out.on(topo.result_topic))["nan"]
    assert sorted(stream.chunks) == [i for i in range(12) if i != 4]
    gap = [r for r in out.on(topo.result_topic) if header(r, "result-type") == "gap"]
    assert len(gap) == 1


def test_a_new_stream_on_an_ended_key_starts_and_a_replayed_chunk_0_does_not(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    first, second = utterance(0)[: 6 * CHUNK], utterance(2)[: 4 * CHUNK]

    def stream(audio: np.ndarray, n: int, tag: str) -> list[Record]:
        return chunk_records("reused", [audio[i * CHUNK : (i + 1) * CHUNK] for i in range(n)], id_prefix=tag)

    one, two = stream(first, 6, "one"), stream(second, 4, "two")
    topo = write_topology(tmp_path, partitions=1, stages=[SEQUENCE_STAGE])
    # The first stream, a replay of its chunk 0 after it ended, then the key's next stream.
    out = _run_until_summaries(kafka_bootstrap, cli_env, tmp_path, topo, [*one, one[0], *two], summaries=2, timeout=60)
    assert out.on(topo.dead_letter_topic) == []
    results = out.on(topo.result_topic)
    chunks = [r for r in results if header(r, "result-type") == "chunk"]
    assert len(chunks) == 10, f"6 + 4 chunk results, the replay dropped (got {len(chunks)})"
    want_second = VadStream(vad_session()).run(to_chunks(second))
    got_second = np.concatenate(
        [gather([r])["reused"].probabilities() for r in chunks[6:]]
    )
    np.testing.assert_allclose(got_second, want_second, atol=1e-5)

