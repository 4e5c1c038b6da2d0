"""Sequence-stage configuration: sample rate agreement with a DALI stage in front, the
post-processor choice (and the older ``segments:`` spelling), retry and stream bound."""

from __future__ import annotations

from pathlib import Path

from pipeline.observability.metrics import PipelineMetrics
from pipeline.runtime.stages import build_stages
from pipeline.settings import Endpoints, KafkaSettings, TritonSettings
from pipeline.topology import load_topology
from tests.unit.test_topology import config_error, write
from workers.sequence import SequenceStage

CHAIN = """\
name: a
input_topic: a.in
result_topic: a.out
stages:
  - {{name: pre, kind: dali, sample_rate: {dali_rate}}}
  - name: vad
    kind: sequence
    model: silero_vad
{sequence}
"""


def test_a_sample_rate_that_differs_from_the_dali_stage_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, CHAIN.format(dali_rate=8000, sequence="    sample_rate: 16000"))
    assert config_error(path) == (
        f"{path}:9: stages[1].sample_rate: sample_rate 16000 differs from stage 'pre', which emits 8000 Hz"
    )


def test_segments_is_read_as_the_vad_segments_post_processor(tmp_path: Path) -> None:
    old = load_topology(write(tmp_path, CHAIN.format(dali_rate=16000, sequence="    segments: {threshold: 0.6}")))
    new = load_topology(
        write(tmp_path, CHAIN.format(dali_rate=16000, sequence="    postprocess: {kind: vad_segments, threshold: 0.6}"), "n.yaml")
    )
    assert old.stages[1] == new.stages[1]
    both = "    segments: {}\n    postprocess: {kind: vad_segments}"
    assert "give either segments or postprocess, not both" in config_error(
        write(tmp_path, CHAIN.format(dali_rate=16000, sequence=both), "b.yaml")
    )


def test_the_registry_hands_the_stage_plain_settings_from_the_topology(tmp_path: Path) -> None:
    sequence = (
        "    sample_rate: 8000\n    max_streams: 100\n    retry: {max_attempts: 2, initial_backoff_ms: 50}\n"
        "    postprocess: {kind: vad_segments, min_speech_ms: 100}"
    )
    topology = load_topology(write(tmp_path, CHAIN.format(dali_rate=8000, sequence=sequence)))
    endpoints = Endpoints(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"), triton=TritonSettings(grpc_url="127.0.0.1:9")
    )
    stages = build_stages(topology, endpoints, PipelineMetrics(), only=["vad"])
    assert len(stages) == 1 and isinstance(stages[0], SequenceStage)
    settings = stages[0].settings
    assert (settings.sample_rate, settings.max_streams, settings.retry.max_attempts) == (8000, 100, 2)
    assert settings.retry.initial_backoff_s == 0.05
    assert settings.vad is not None and settings.vad.min_speech_ms == 100
    assert stages[0].states.limits.max_keys == 100
