"""The JSON schema of topology files, for editors and for review.

Generated from the pydantic models, so it cannot drift from what the loader
accepts; ``topologies/topology.schema.json`` is a committed copy (a unit test
keeps it current) that YAML language servers pick up through a
``# yaml-language-server: $schema=./topology.schema.json`` first line.

The schema describes the file *after* ``${VAR}`` interpolation: an editor
flags ``partitions: ${PARTITIONS:-4}`` as "not an integer" although the
loader accepts it.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.topology.model import Topology

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def topology_json_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of a topology file."""
    return {"$schema": DIALECT, **Topology.model_json_schema(mode="validation")}


def render_schema() -> str:
    """The schema as the committed file holds it: indented JSON and a final newline."""
    return json.dumps(topology_json_schema(), indent=2, ensure_ascii=False) + "\n"
