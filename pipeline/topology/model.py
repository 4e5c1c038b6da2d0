"""The topology file, as typed pydantic models.

A topology is a *linear* chain of stages between two Kafka topics: records
come in on ``input_topic``, each stage consumes one topic and produces the
next, and the last stage produces ``result_topic``. Intermediate topics and
consumer group ids are derived from names, so a minimal file only names the
models; every derived value is computed here, in one place, so workers, the
topic creator and ``pipeline validate`` can never disagree about them.

Every model forbids unknown keys and validates strictly (no ``"4"`` -> ``4``
coercion): a typo in a config file must fail loudly at load time, not turn
into a silently ignored option in production. Field docstrings double as
descriptions in the generated JSON schema, which editors show on hover.

Validators that can point at something more precise than the field they run
on (a duplicate stage name, a topic conflict) raise
:class:`~pydantic_core.PydanticCustomError` with ``ctx["at"]``: a path relative
to the error's location, which the loader uses for the line number.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from pipeline.topology.chain import StageTopics as StageTopics  # re-exported: the model's public API
from pipeline.topology.chain import chain_topics, check_side_topics, resolve_chain
from pipeline.topology.checkpoint import CheckpointConfig
from pipeline.topology.fields import (  # the shared scalar types, re-exported here
    Duration,
    Endpoint,
    ModelVersion,
    Name,
    TensorMap,
    TopicName,
    _located,
    _Strict,
)
from pipeline.topology.fusion import FusedChain, FusionError, check_chains, fuse_steps, fused_stage, interface
from pipeline.topology.graph import BRANCH_GONE_AFTER_S, MAX_WAIT_S, Graph, GraphError, StepSpec, compile_graph
from pipeline.topology.lanes import Lane, LaneConfig, lane_problem, resolve_lanes
from pipeline.topology.padding import PaddingConfig
from pipeline.topology.routes import RouteBy, RouteConfig, ShadowConfig, check_routes, shadow_topic
from pipeline.topology.shared_memory import SharedMemoryConfig
from pipeline.topology.tenants import TenantsConfig, check_delay_topics

# --------------------------------------------------------------------------- sections


_KAFKA_ENV_ONLY = {
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
}


_PIPELINE_TOPIC_CONFIGS = frozenset({"cleanup.policy", "max.message.bytes"})


class KafkaSection(_Strict):
    """Kafka options that belong to the topology. Credentials and TLS come from the environment."""

    bootstrap_servers: Endpoint = None
    """Overrides PIPELINE_KAFKA_BOOTSTRAP_SERVERS; null = environment, else the embedded stack."""
    partitions: PositiveInt = 1
    """Partitions of the topics the pipeline creates; bounds how many workers share a stage."""
    replication_factor: int = -1
    """Replication factor of the topics the pipeline creates; -1 (the default): the broker's own
    ``default.replication.factor``, so a managed Kafka with ``min.insync.replicas=2`` gets topics
    it can write to without the topology knowing its size."""

    topic_configs: dict[str, str | int] = Field(default_factory=dict)
    """Kafka topic settings for every topic the pipeline creates, by their Kafka names: with
    ``replication_factor: 3``, ``min.insync.replicas: 2``, so an ``acks=all`` write needs two
    copies. What the pipeline sets itself (``cleanup.policy`` of state topics,
    ``max.message.bytes`` from the record limits) cannot be set here. Existing topics are left
    as they are."""

    @field_validator("replication_factor")
    @classmethod
    def _replication_factor(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("replication_factor must be -1 (the broker's default) or 1 or more")
        return value

    @field_validator("topic_configs")
    @classmethod
    def _topic_configs(cls, value: dict[str, str | int]) -> dict[str, str | int]:
        owned = sorted(set(value) & _PIPELINE_TOPIC_CONFIGS)
        if owned:
            raise ValueError(f"{', '.join(owned)} is set by the pipeline itself")
        return value

    def topic_settings(self) -> dict[str, str]:
        """``topic_configs`` as the broker takes them (every value a string)."""
        return {name: str(value) for name, value in self.topic_configs.items()}

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        # Topology files get committed and shared; a password in one is a leak waiting to happen.
        if isinstance(data, dict):
            for key in data:
                if key in _KAFKA_ENV_ONLY:
                    raise _located(
                        "security options come from the environment only: "
                        f"set PIPELINE_KAFKA_{key.upper()} instead",
                        (key,),
                    )
        return data


class TritonSection(_Strict):
    """Which Triton the pipeline calls."""

    grpc_url: Endpoint = None
    """Triton gRPC host:port; null = PIPELINE_TRITON_GRPC_URL, else the embedded stack."""


class Batching(_Strict):
    """Client-side micro-batching and the backpressure bounds of one stage."""

    max_batch_size: PositiveInt | None = None
    """Requests per inference call; null = the model's max_batch_size as Triton reports it."""
    max_queue_delay_ms: NonNegativeFloat = 5.0
    """How long a partial batch waits for more requests, while every call is busy, before it
    is sent anyway (with a call free it goes at once, unless hold_partial_batches)."""
    hold_partial_batches: bool = False
    """true: a partial batch always waits max_queue_delay_ms, even with a call free (fuller
    batches at moderate load, for that much more latency); false: work conserving, as
    Triton's own dynamic batcher (a free call takes what is queued at once)."""
    max_inflight_batches: PositiveInt = 4
    """Inference calls outstanding at once, per worker."""
    max_pending_requests: PositiveInt = 4096
    """Requests consumed but not yet answered; above it, consumption pauses (backpressure)."""
    max_batch_bytes: PositiveInt | None = 64 * 1024 * 1024
    """A batch is sent once its requests hold this many bytes, whatever its rows (a request
    larger than this goes alone); null = rows only."""


class RetryConfig(_Strict):
    """Retries of a failed inference call, with exponential backoff."""

    max_attempts: PositiveInt = 5
    """Attempts in total, the first included; 1 = no retry. Then the record goes to dead letters."""
    initial_backoff_ms: NonNegativeFloat = 100.0
    """Wait before the first retry; doubles on each further one."""
    max_backoff_ms: NonNegativeFloat = 5000.0
    """Upper bound on the wait between retries."""

    @model_validator(mode="after")
    def _backoff_order(self) -> RetryConfig:
        if self.max_backoff_ms < self.initial_backoff_ms:
            raise _located(
                f"max_backoff_ms ({self.max_backoff_ms:g}) is below "
                f"initial_backoff_ms ({self.initial_backoff_ms:g})",
                ("max_backoff_ms",),
            )
        return self


# --------------------------------------------------------------------------- stages


class JoinConfig(_Strict):
    """How a step (or the result) waits for the branches it needs, by correlation ID."""

    mode: Literal["inner", "outer", "any"] = "inner"
    """inner: wait for every branch (dead-letter what is incomplete when the window closes);
    outer: emit what arrived when the window closes, marked partial with the missing branches;
    any: the first branch to arrive wins."""
    window_ms: PositiveFloat = 5000.0
    """How long after the first branch arrives the others may come (event time)."""
    branch_gone_after: Duration = Field(default=BRANCH_GONE_AFTER_S, json_schema_extra={"default": "3m"})
    """A missing branch whose consumer group (or one upstream of it) has had no live member
    this long is gone: its windows close (rule ``gone``). Until then a branch that is only
    behind (a backlog, a rejoin, a rolling deploy) holds them, however long since it
    committed. E.g. "3m" (the default)."""
    max_wait: Duration | None = Field(default=MAX_WAIT_S, json_schema_extra={"default": "10m"})
    """The hard limit on an open window, from when the join first held it (rule ``max-wait``):
    what a branch that is alive but stuck costs at most. Shorter dead-letters requests during
    long backlogs; null waits for ever (``max_open_joins`` still bounds memory). E.g. "10m"
    (the default)."""

    @model_validator(mode="after")
    def _check_max_wait(self) -> JoinConfig:
        if self.max_wait is not None and self.max_wait * 1000 < self.window_ms:
            raise _located(
                f"max_wait ({self.max_wait:g} s) is shorter than window_ms ({self.window_ms:g} ms): "
                "every window would close on it",
                ("max_wait",),
            )
        return self


class _StageBase(_Strict):
    name: Name
    """Unique within the topology; part of the consumer group id and of derived topic names."""
    input_topic: TopicName | None = None
    """Topic this stage consumes; null = the previous stage's output (first stage: input_topic)."""
    output_topic: TopicName | None = None
    """Topic this stage produces; null = <topology>.<stage>.out (last stage: result_topic)."""
    stall_after_s: PositiveFloat | None = None
    """Watchdog: /readyz answers 503 while a partition's oldest unfinished record is older
    than this; null = 2 x call_timeout_s (DALI: run_timeout_s; sequence: plus gap_timeout_s)."""


class StatelessStageConfig(_StageBase):
    """Independent requests to one Triton model (or to routes), micro-batched across records."""

    kind: Literal["stateless"]
    model: str = ""
    """Triton model name; required unless the stage has routes."""
    model_version: ModelVersion = ""
    """"" = the latest version Triton serves; else a pinned version number."""
    routes: list[RouteConfig] | None = Field(default=None, min_length=1)
    """Instead of model: several models, one chosen per record (pipeline/topology/routes.py)."""
    route_by: RouteBy = "key"
    """key: by weight, sticky per record key (canary, A/B); task: by the record's task header."""
    shadow: ShadowConfig | None = None
    """A model every request is mirrored to, best effort; its results go to the shadow topic."""
    input_map: TensorMap = Field(default_factory=dict)
    """Model input name -> topology tensor it reads (Triton ensemble style); {} = same names."""
    output_map: TensorMap = Field(default_factory=dict)
    """Model output tensor name -> topology tensor name it is published as; {} = same names."""
    batching: Batching = Field(default_factory=Batching)
    deadline_ms: PositiveFloat | None = None
    """Deadline (ms after the record's timestamp) of a request that carries none; past it the
    request goes to the dead-letter topic with reason "deadline exceeded", not to Triton."""
    priority: NonNegativeInt | None = None
    """Triton request priority (1 = highest, 0 = the model's default)."""
    timeout_ms: PositiveFloat | None = None
    """Triton-side timeout of one inference call."""
    retry: RetryConfig = Field(default_factory=RetryConfig)
    max_request_bytes: PositiveInt = 16 * 1024 * 1024
    """Larger record values are dead-lettered (oversized-value) before any decoding."""
    join: JoinConfig = Field(default_factory=JoinConfig)
    """Graph topologies: how this step waits when its inputs come from parallel branches."""
    warmup: bool = False
    """Infer once before consuming, so the first real record does not pay for model start-up."""
    call_timeout_s: PositiveFloat = 30.0
    """Client-side bound on one Triton call (the request's own deadline when earlier); a call
    that times out while Triton does not answer its readiness probe is an outage (waits)."""
    shared_memory: SharedMemoryConfig = Field(default_factory=SharedMemoryConfig)
    """Large tensors through Triton's system shared memory when Triton runs on this host."""
    padding: PaddingConfig | None = None
    """Length-aware batching: pad a variable-length input to buckets (see README
    "Length-aware batching"); null = batches of exactly equal shapes only."""

    tenants: TenantsConfig | None = None
    """Per-tenant rate limits, over-quota policy and fair batches (chains only); null = none."""

    @model_validator(mode="after")
    def _routes(self) -> StatelessStageConfig:
        check_routes(self)
        if self.routes is not None:
            # Both read one model's metadata and hold one model's resources at start-up.
            if self.padding is not None:
                raise _located("padding needs one model; a stage with routes has several", ("padding",))
            if self.shared_memory.mode != "off":
                raise _located("shared_memory serves one model; a stage with routes has several", ("shared_memory",))
        return self


class DaliStageConfig(_StageBase):
    """Audio pre-processing with NVIDIA DALI: decode, downmix, resample; no Triton model.

    Stateless and batched across records like any stateless stage. Framing into
    the model's window needs samples carried over from chunk to chunk, so it is
    done by the sequence stage, whose per-stream state is checkpointed.
    """

    kind: Literal["dali"]
    sample_rate: PositiveInt = 16000
    """Sample rate (Hz) the stage produces."""
    device: Literal["auto", "cpu", "gpu"] = "auto"
    """Where DALI runs; auto = the GPU when one is visible."""
    input_tensor: str = "audio"
    """Request tensor holding the chunk: BYTES (a WAV file) or INT16/FP32 PCM with a
    ``sample_rate`` request parameter."""
    output_tensor: str = "audio"
    """Tensor the 16 kHz mono FP32 samples are published as."""
    max_chunk_seconds: PositiveFloat = 10.0
    """Longer chunks are dead-lettered: a chunk is a piece of a stream, not a recording."""
    batching: Batching = Field(default_factory=Batching)
    max_request_bytes: PositiveInt = 16 * 1024 * 1024
    run_timeout_s: PositiveFloat = 30.0
    """Bound on one DALI run; a run past it is abandoned on its thread (a fresh thread and
    pipeline serve later runs) and fails its batch like any DALI error (split, then dead letter)."""


class VadSegmentsConfig(_Strict):
    """Post-processor ``vad_segments``: speech segments from per-frame probabilities
    (Silero's hysteresis rule) and a per-stream summary."""

    kind: Literal["vad_segments"] = "vad_segments"
    threshold: float = Field(default=0.5, gt=0, lt=1)
    """A frame at or above this probability is speech."""
    neg_threshold: float = Field(default=0.35, gt=0, lt=1)
    """Below this, a frame counts towards closing a segment."""
    min_speech_ms: NonNegativeFloat = 250.0
    """Shorter segments are not reported."""
    min_silence_ms: NonNegativeFloat = 300.0
    """Silence needed to close a segment."""
    output: str = "probability"
    """Model output holding the per-frame probability."""


class SequenceStageConfig(_StageBase):
    """A stateful Triton model: all records of one key go to one Triton sequence, in order."""

    kind: Literal["sequence"]
    model: str = Field(min_length=1)
    """Triton model name; the model must declare sequence_batching."""
    model_version: ModelVersion = ""
    input_tensor: str = "audio"
    """Request tensor with the stream's new samples; framed into the model's window."""
    model_input: str | None = None
    """Model input the frames go to; null = the model's first non-optional input."""
    sample_rate: PositiveInt = 16000
    """Samples per second of the incoming samples (a DALI stage in front: its sample_rate)."""
    state_map: TensorMap = Field(default_factory=dict)
    """Model state input -> the output that feeds it (e.g. state_in: state_out). The worker
    checkpoints these outputs to Kafka and sends them back with START to resume a sequence
    after a crash, a rebalance or a Triton restart."""
    idle_timeout_s: PositiveFloat | None = None
    """A stream with no chunk for this long is closed (summary with reason "idle");
    null = the model's max_sequence_idle_microseconds."""
    upstream_gone_after: Duration = Field(default=BRANCH_GONE_AFTER_S, json_schema_extra={"default": "3m"})
    """Idle is judged in event time, and only once the stages before this one are caught
    up, or gone: no live member in their consumer group this long. E.g. "3m" (the default)."""
    max_inflight_requests: PositiveInt = 64
    """Triton calls in flight at once (one per stream at most)."""
    reorder_window: PositiveInt = 16
    """Chunks that may arrive ahead of a missing one; further ahead is dead-lettered."""
    gap_timeout_s: PositiveFloat = 5.0
    """How long later chunks wait for a missing one before the gap policy applies."""
    gap_policy: Literal["skip", "fail"] = "skip"
    """skip: go on without the missing chunk (a ``gap`` result marks it; also when later
    chunks overflow the reorder window); fail: dead-letter the waiting chunks and close the
    stream (summary reason "gap")."""
    max_chunk_seconds: PositiveFloat = 10.0
    """Longest chunk accepted; longer ones are dead-lettered (bounds one record's work)."""
    ended_retention_s: PositiveFloat = 600.0
    """How long an ended stream is remembered, so late duplicates are recognised."""
    max_streams: PositiveInt | None = None
    """Streams one worker holds state for; when a new stream would exceed it, the idlest
    stream is closed (summary with reason "evicted") and forgotten. null = unbounded."""
    max_pending_requests: PositiveInt = 4096
    retry: RetryConfig = Field(default_factory=RetryConfig)
    """Retries of a failed Triton call (outages wait without counting attempts)."""
    call_timeout_s: PositiveFloat = 30.0
    """Client-side bound on one Triton call (one frame); a timeout while Triton does not
    answer its readiness probe is an outage (waits, nothing dead-lettered)."""
    postprocess: VadSegmentsConfig | None = None
    """What to emit besides each chunk's outputs; null = chunk results only."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """How many chunks of a stream one state checkpoint covers (coalesced checkpoints)."""

    @model_validator(mode="before")
    @classmethod
    def _segments_alias(cls, data: Any) -> Any:
        """``segments:`` (before post-processors had a kind) means ``postprocess: vad_segments``."""
        if isinstance(data, dict) and "segments" in data:
            data = dict(data)
            if "postprocess" in data:
                raise ValueError("give either segments or postprocess, not both")
            segments = data.pop("segments")
            data["postprocess"] = None if segments is None else {"kind": "vad_segments", **segments}
        return data


Stage = Annotated[StatelessStageConfig | DaliStageConfig | SequenceStageConfig, Field(discriminator="kind")]
"""One stage; ``kind`` selects the model."""

ModelStageConfig = (StatelessStageConfig, SequenceStageConfig)
"""Stage kinds that call a Triton model (``isinstance`` target)."""


# --------------------------------------------------------------------------- stage rules
# Which kinds of stage a topology may combine: kept with the stage models, called by
# :class:`Topology`'s validator (chains: sample rates; graphs: what a step may be).


def check_sample_rates(stages: list[Stage]) -> None:
    """In a chain, a DALI stage feeding a sequence stage emits the sample rate that stage reads."""
    for index, (before, stage) in enumerate(itertools.pairwise(stages), start=1):
        if (
            isinstance(before, DaliStageConfig)
            and isinstance(stage, SequenceStageConfig)
            and before.sample_rate != stage.sample_rate
        ):
            raise _located(
                f"sample_rate {stage.sample_rate} differs from stage {before.name!r}, "
                f"which emits {before.sample_rate} Hz",
                ("stages", index, "sample_rate"),
            )


def check_graph_steps(stages: list[Stage]) -> None:
    """Graph steps are stateless stages serving one model, with explicit tensor maps and
    no topics of their own (the graph wires them)."""
    for index, stage in enumerate(stages):
        if not isinstance(stage, StatelessStageConfig):
            raise _located(f"graph steps are stateless stages; {stage.kind!r} runs in chains only", ("stages", index, "kind"))
        if stage.input_topic or stage.output_topic:
            raise _located("graph steps get their topics from the graph", ("stages", index, "input_topic"))
        if stage.routes or stage.shadow:
            key = "routes" if stage.routes else "shadow"
            raise _located("graph steps serve one model; routes and shadow are for chains", ("stages", index, key))
        if stage.tenants is not None:
            raise _located("tenants are declared on chain stages only", ("stages", index, "tenants"))
        for field in ("input_map", "output_map"):
            if not getattr(stage, field):
                raise _located(f"graph steps map their tensors explicitly ({field} is empty)", ("stages", index, field))


# --------------------------------------------------------------------------- topology


class Topology(_Strict):
    """A streaming inference pipeline: Kafka input topic -> stages -> Kafka result topic."""

    name: Name
    """Used in consumer group ids (<name>.<stage>) and default topic names."""
    kafka: KafkaSection = Field(default_factory=KafkaSection)
    triton: TritonSection = Field(default_factory=TritonSection)
    input_topic: TopicName
    """Topic the first stage consumes."""
    lanes: list[LaneConfig] = Field(default_factory=list)
    """Priority lanes, highest first: more input topics the first stage reads before
    input_topic (the lowest lane). See pipeline/topology/lanes.py."""
    result_topic: TopicName
    """Topic the last stage produces."""
    dead_letter_topic: TopicName = Field(
        default_factory=lambda data: f"{data['name']}.dead-letters"
    )
    """Where records that fail for good go, with the reason; default <name>.dead-letters."""
    metrics_topic: TopicName = "pipeline.metrics"
    """Where workers publish periodic metric snapshots."""
    metrics_interval_s: PositiveFloat = 10.0
    """Seconds between metric snapshots."""
    http_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the health/metrics HTTP endpoint; unset = the stable default 9400
    (``pipeline.runtime.health.DEFAULT_PORT``), 0 = any free port."""
    delivery: Literal["at_least_once", "exactly_once"] = "at_least_once"
    """``exactly_once``: each stage's outputs and the input offsets they answer commit in one
    Kafka transaction (a transactional producer per input partition), so a ``read_committed``
    reader sees every output once, through crashes and rebalances. Needs a broker with
    transactions (not Tansu). A sequence stage then checkpoints every chunk. docs/streaming.md."""
    drain_timeout_s: PositiveFloat = 30.0
    """SIGTERM: how long the process may take to finish, commit and close; work still
    unfinished then is abandoned uncommitted (its records are replayed by the next owner)."""
    inputs: list[str] | None = None
    """Graph topologies: the request's tensors (topology-wide names)."""
    outputs: list[str] | None = None
    """Graph topologies: the tensors written to the result topic. Setting it makes the
    stages a graph wired by input_map/output_map (Triton ensemble semantics) instead of a
    chain; fan-out and joins follow from the maps."""
    result_join: JoinConfig = Field(default_factory=JoinConfig)
    """Graph topologies: how the result waits when its outputs come from parallel branches."""
    max_open_joins: PositiveInt | None = 100_000
    """Open joins one worker holds (per join stage); when a new correlation ID would exceed
    it, the idlest open join is closed as if its window ended (inner: its branches are
    dead-lettered; outer: a partial result). null = unbounded."""
    stages: list[Stage] = Field(min_length=1)
    fuse: list[FusedChain] = Field(default_factory=list)
    """Graph topologies: sets of stateless steps (a chain, or a fan-out + inner join), each run as
    ONE stage through a generated Triton ensemble (no Kafka hop or join stage inside); the entry
    step first. See pipeline/topology/fusion.py."""

    @property
    def is_graph(self) -> bool:
        return self.outputs is not None

    @property
    def exactly_once(self) -> bool:
        """``delivery: exactly_once``: stages write in transactions, readers read committed."""
        return self.delivery == "exactly_once"

    def step_specs(self) -> list[StepSpec]:
        """The unfused graph steps: each stateless stage's name and tensor maps."""
        return [
            StepSpec(
                s.name, s.input_map, s.output_map, s.join.mode, s.join.window_ms, s.join.branch_gone_after, s.join.max_wait
            )
            for s in self.stages
            if isinstance(s, StatelessStageConfig)
        ]

    def graph(self, *, fused: bool = True) -> Graph:
        """The compiled graph (graph topologies only); ``fused=False``: every step its own stage."""
        steps = self.step_specs()
        return compile_graph(
            topology=self.name,
            steps=fuse_steps(steps, self.fuse, self.outputs or []) if fused else steps,
            inputs=self.inputs or [],
            outputs=self.outputs or [],
            input_topic=self.input_topic,
            result_topic=self.result_topic,
            result_join_mode=self.result_join.mode,
            result_join_window_ms=self.result_join.window_ms,
            result_join_gone_after_s=self.result_join.branch_gone_after,
            result_join_max_wait_s=self.result_join.max_wait,
        )

    def _check_graph(self) -> None:
        if not self.outputs:
            raise _located("a graph topology names at least one output tensor", ("outputs",))
        if not self.inputs:
            raise _located("a graph topology names its input tensors", ("inputs",))
        check_graph_steps(self.stages)
        try:
            self.graph(fused=False)
        except GraphError as exc:
            where = next((i for i, s in enumerate(self.stages) if s.name == exc.step), None)
            raise _located(str(exc), ("stages", where, exc.field_name) if where is not None else (exc.field_name,)) from None

    @model_validator(mode="after")
    def _check_chain(self) -> Topology:
        seen: dict[str, int] = {}
        for index, stage in enumerate(self.stages):
            if stage.name in seen:
                raise _located(
                    f"duplicate stage name {stage.name!r} (also stages[{seen[stage.name]}])",
                    ("stages", index, "name"),
                )
            seen[stage.name] = index
        if self.is_graph:
            self._check_graph()
            self._check_lanes()
        try:
            check_chains(
                self.fuse,
                {s.name: s.kind for s in self.stages},
                is_graph=self.is_graph,
                unfused=self.graph(fused=False) if self.is_graph else None,
            )
        except FusionError as exc:
            raise _located(str(exc), exc.at) from None
        if self.is_graph:
            return self
        chain = self.stage_topics()
        topics = chain_topics(chain)
        check_sample_rates(self.stages)
        check_side_topics(
            topics,
            shadows=self._shadow_topics(chain),
            dead_letter_topic=self.dead_letter_topic,
            metrics_topic=self.metrics_topic,
        )
        check_delay_topics(self._delay_topics(chain), [*topics, self.dead_letter_topic, self.metrics_topic])
        self._check_lanes()
        return self

    def _check_lanes(self) -> None:
        first = None if self.is_graph else (self.stages[0].name, self.stages[0].kind)
        chain = self.stage_topics() if self.lanes and first else []
        others = {t.output: f"output of stage {s.name!r}" for s, t in zip(self.stages, chain, strict=False)}
        others.update({t: "a state topic" for t in (self.state_topics() if chain else [])})
        others.update({self.input_topic: "input_topic", self.dead_letter_topic: "dead_letter_topic"})
        others[self.metrics_topic] = "metrics_topic"
        if problem := lane_problem(self.lanes, input_topic=self.input_topic, other_topics=others, first_stage=first):
            raise _located(*problem)

    def resolved_lanes(self) -> tuple[Lane, ...]:
        """Every lane, highest first, input_topic's own last; () without lanes."""
        return resolve_lanes(self.input_topic, self.lanes)

    def _delay_topics(self, chain: list[StageTopics]) -> list[tuple[int, str]]:
        """(stage index, delay topic) of each stage whose over-quota records wait (tenants.py)."""
        return [
            (index, delay)
            for index, (stage, edge) in enumerate(zip(self.stages, chain, strict=True))
            if isinstance(stage, StatelessStageConfig)
            and stage.tenants is not None
            and (delay := stage.tenants.delay_topic_for(edge.input)) is not None
        ]

    def stage_topics(self) -> list[StageTopics]:
        """The resolved (input, output) topics of each stage, aligned with :attr:`stages`."""
        return resolve_chain(self.name, self.stages, input_topic=self.input_topic, result_topic=self.result_topic)

    def group_id(self, stage: str) -> str:
        """Kafka consumer group of ``stage``: every worker running it joins this group."""
        graph = self.graph() if self.is_graph else None
        known = [*graph.steps, *graph.joins] if graph is not None else [s.name for s in self.stages]
        if stage not in known and not any(s.name == stage for s in self.stages):
            raise KeyError(f"topology {self.name!r} has no stage {stage!r}")
        return f"{self.name}.{stage}"

    def topics(self) -> list[str]:
        """Every topic the pipeline uses, in chain order, then dead letters and metrics."""
        if self.is_graph:
            return [*self.graph().topics(), self.dead_letter_topic, self.metrics_topic]
        chain = self.stage_topics()
        return [
            chain[0].input,
            *(lane.topic for lane in self.resolved_lanes()[:-1]),
            *(t.output for t in chain),
            *(topic for _, topic in self._shadow_topics(chain)),
            self.dead_letter_topic,
            self.metrics_topic,
            *(topic for _, topic in self._delay_topics(chain)),
        ]

    def _shadow_topics(self, chain: list[StageTopics]) -> list[tuple[int, str]]:
        """(stage index, shadow topic) of each stage with a shadow."""
        return [
            (index, shadow_topic(stage.shadow, topics.output))
            for index, (stage, topics) in enumerate(zip(self.stages, chain, strict=True))
            if isinstance(stage, StatelessStageConfig) and stage.shadow is not None
        ]

    def shadow_topic(self, stage: str) -> str | None:
        """Where ``stage``'s shadow results go; None for a stage without a shadow."""
        return dict((self.stages[i].name, t) for i, t in self._shadow_topics(self.stage_topics())).get(stage)

    def state_topic(self, stage: str) -> str:
        """Compacted changelog of a stateful stage's per-stream state."""
        return f"{self.group_id(stage)}.state"

    def state_topics(self) -> list[str]:
        stateful = [self.state_topic(s.name) for s in self.stages if isinstance(s, SequenceStageConfig)]
        if self.is_graph:
            stateful += [f"{self.name}.{join}.state" for join in self.graph().joins]
        return stateful

    def stage(self, name: str) -> Stage:
        """The stage called ``name``; a fused chain's name gives its fused stage's configuration."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        for chain in self.fuse:
            if chain.stage_name == name:
                first = self.stage(chain.steps[0])
                assert isinstance(first, StatelessStageConfig)
                return fused_stage(chain, first, self.name, interface(chain, self.step_specs(), self.outputs or []))
        raise KeyError(f"topology {self.name!r} has no stage {name!r}")
