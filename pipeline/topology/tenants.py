"""The ``tenants`` section of a stateless stage: who is calling, and how much each may call.

Declared per stage, not per topology: a quota bounds the calls to one model (one stage's
Triton capacity), the delay topic is derived from that stage's input topic, and in a chain
only the stage where callers' requests enter needs one. A stage without the section serves
every record as before.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from pipeline.topology.fields import _TOPIC_MAX, _located, _Strict

DELAY_SUFFIX = ".delay"


class Quota(_Strict):
    """A token bucket: ``rate`` requests per second on average, ``burst`` at once."""

    rate: PositiveFloat
    """Requests per second a tenant may send, on average."""
    burst: PositiveInt = 1
    """Requests a tenant may send at once after a quiet spell (the bucket's size)."""


class TenantQuota(Quota):
    """One tenant's own quota, replacing the default."""

    tenant: str = Field(min_length=1, max_length=256)
    """The tenant's name, as the header or key prefix carries it."""


class TenantsConfig(_Strict):
    """Per-tenant rate limits and a fair share of each batch."""

    model_config = ConfigDict(populate_by_name=True)  # `from` in YAML, `source` in code

    source: Literal["header", "key_prefix"] = Field(default="header", alias="from")
    """Where a record names its tenant: a header, or the record key up to ``separator``."""
    header: str = Field(default="tenant", min_length=1)
    """``from: header``: the header's name (case-insensitive)."""
    separator: str = Field(default=":", min_length=1)
    """``from: key_prefix``: the key is ``<tenant><separator><rest>``; a key without it has no tenant."""
    default: Quota
    """The quota of every tenant not listed in ``overrides`` (records naming no tenant included)."""
    overrides: list[TenantQuota] = Field(default_factory=list)
    """Tenants with their own quota."""
    over_quota: Literal["delay", "dead-letter"] = "delay"
    """delay: the record moves to the delay topic ``<stage input topic>.delay`` and is
    served when due (it leaves its partition's order); dead-letter: a ``quota-exceeded``
    dead letter at once."""
    max_delays: PositiveInt = 5
    """A record over quota this many times already is dead-lettered ``quota-exceeded``."""
    max_delay_ms: PositiveFloat = 5000.0
    """Furthest a delayed record is scheduled ahead (its tenant's backlog is spread at its rate up to this)."""
    max_labelled_tenants: PositiveInt = 100
    """Metric label cardinality: the overrides, then the first tenants seen up to this many,
    keep their name in ``tenant``; any other is labelled ``other``."""
    fair_share: bool = False
    """Form batches when a call can start and split their rows fairly (max-min) between the
    tenants waiting. Results still leave in partition order, so this shortens no latency for
    a tenant whose records share partitions with another's backlog; it costs CPU per call."""

    @model_validator(mode="after")
    def _unique_overrides(self) -> TenantsConfig:
        seen: dict[str, int] = {}
        for index, override in enumerate(self.overrides):
            if override.tenant in seen:
                raise _located(
                    f"duplicate tenant {override.tenant!r} (also overrides[{seen[override.tenant]}])",
                    ("overrides", index, "tenant"),
                )
            seen[override.tenant] = index
        return self

    def delay_topic_for(self, input_topic: str) -> str | None:
        """The delay topic of a stage reading ``input_topic`` (None: policy dead-letter)."""
        return f"{input_topic}{DELAY_SUFFIX}" if self.over_quota == "delay" else None


def check_delay_topics(delays: list[tuple[int, str]], taken: list[str]) -> None:
    """Each delay topic (stage index, topic) must be its own: not a chain, dead-letter,
    metrics or another stage's delay topic (a stage would consume records not meant for it)."""
    seen = list(taken)
    for index, topic in delays:
        where = ("stages", index, "tenants", "over_quota")
        if topic in seen:
            raise _located(f"the delay topic {topic!r} is also another topic of the topology", where)
        if len(topic) > _TOPIC_MAX:
            raise _located(f"the delay topic {topic!r} is longer than {_TOPIC_MAX} characters", where)
        seen.append(topic)

