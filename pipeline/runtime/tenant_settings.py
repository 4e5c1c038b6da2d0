"""A stage's ``tenants`` section (pipeline/topology/tenants.py) as the gate's plain settings,
and the stage's inputs with its delay topic added (the stage consumes it too)."""

from __future__ import annotations

from dataclasses import replace

from pipeline.topology.tenants import TenantsConfig
from workers.runtime.stage_io import StageIO
from workers.stateless.tenancy.gate import TenancySettings
from workers.stateless.tenancy.quotas import QuotaSpec


def tenancy_settings(config: TenantsConfig | None, input_topic: str) -> TenancySettings | None:
    if config is None:
        return None
    return TenancySettings(
        default=QuotaSpec(config.default.rate, config.default.burst),
        overrides={o.tenant: QuotaSpec(o.rate, o.burst) for o in config.overrides},
        source=config.source,
        header=config.header,
        separator=config.separator,
        delay_topic=config.delay_topic_for(input_topic),
        max_delays=config.max_delays,
        max_delay_s=config.max_delay_ms / 1000,
        max_labelled_tenants=config.max_labelled_tenants,
        fair_share=config.fair_share,
    )


def with_delay_topic(io: StageIO, tenancy: TenancySettings | None) -> StageIO:
    """The stage reads its delay topic beside its input (same partitions, created with the others)."""
    if tenancy is None or tenancy.delay_topic is None:
        return io
    return replace(io, more_input_topics=(*io.more_input_topics, tenancy.delay_topic))
