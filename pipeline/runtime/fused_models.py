"""Make the generated ensembles of a topology's fused sets (chains, fan-out + join) exist and be READY in Triton.

Run by ``pipeline run`` before its stages start (a fused stage's readiness check
then finds its model like any other). For each chain whose fused stage this
process runs: describe the member models Triton serves, check they can be
ensemble members, generate the ensemble (:mod:`pipeline.modelstore.ensemble`),
and, unless Triton already serves a config with the same digest, push it to
the S3 model store and load it (explicit model-control mode). So the ensemble
follows the topology and its members: a changed map, a member with other
tensors or batch size, or a pinned version is regenerated at the next start,
and an unchanged one is not reloaded under the processes already using it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pipeline.errors import ConfigError
from pipeline.modelstore.ensemble import DIGEST_PARAMETER, EnsembleMember, GeneratedEnsemble, generate_ensemble
from pipeline.modelstore.store import ModelStore
from pipeline.settings import Endpoints
from pipeline.topology.fusion import FusedChain, ensemble_name, fusable_problems, interface
from pipeline.topology.model import StatelessStageConfig, Topology
from pipeline.triton.admin import TritonAdmin

log = logging.getLogger(__name__)


def ensure_fused_models(topology: Topology, endpoints: Endpoints, only: Sequence[str] = ()) -> list[str]:
    """Push and load what changed; returns the ensembles (re)loaded. Blocking: run in a thread."""
    chains = [c for c in topology.fuse if not only or c.stage_name in only]
    if not chains:
        return []
    if not endpoints.s3.configured:
        raise ConfigError(
            "fused chains need the S3 model store Triton reads (PIPELINE_S3_ENDPOINT): "
            "their generated ensembles are pushed there"
        )
    loaded = []
    with TritonAdmin(endpoints.triton) as admin:
        for chain in chains:
            generated = generate_for(topology, chain, admin)
            if admin.loaded_parameter(generated.name, DIGEST_PARAMETER) == generated.digest:
                log.info("ensemble %s is current (digest %s)", generated.name, generated.digest[:12])
                continue
            ModelStore(endpoints.s3).put_generated(generated.name, generated.files())
            admin.load(generated.name)
            log.info("ensemble %s pushed and loaded (steps %s)", generated.name, ", ".join(chain.steps))
            loaded.append(generated.name)
    return loaded


def generate_for(topology: Topology, chain: FusedChain, admin: TritonAdmin) -> GeneratedEnsemble:
    """The ensemble of ``chain`` from the members Triton serves now; ConfigError if they cannot fuse."""
    members, problems = [], []
    # Topological order (the entry first, every branch before the step joining it).
    for step in [name for name in topology.graph(fused=False).order if name in chain.steps]:
        config = topology.stage(step)
        assert isinstance(config, StatelessStageConfig)  # the loader admits nothing else
        description = admin.describe(config.model, config.model_version)
        problems += fusable_problems(
            step,
            config.model,
            max_batch_size=description.max_batch_size,
            sequence=description.sequence_batching is not None,
            decoupled=description.decoupled,
        )
        members.append(
            EnsembleMember(step, config.model, config.model_version, config.input_map, config.output_map, description)
        )
    if problems:
        raise ConfigError("; ".join(problems))
    face = interface(chain, topology.step_specs(), topology.outputs or [])
    return generate_ensemble(
        ensemble_name(topology.name, chain), members, face.inputs, face.outputs, topology=topology.name
    )
