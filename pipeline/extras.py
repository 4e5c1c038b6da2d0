"""Features behind an extra: each imports its library lazily, and says which extra brings it.

``pip install streaming-inference-pipeline`` installs the core only. Two features
need more, and import it only when they are used, never when ``pipeline`` (or
its client or CLI) is imported:

- the DALI audio stage (``kind: dali``): NVIDIA DALI, the ``audio`` extra;
- ``pipeline bench --plot``: matplotlib, the ``plot`` extra.

Used without its library, a feature fails with one line (a :class:`MissingExtra`,
a :class:`~pipeline.errors.ConfigError`) naming the extra to install.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from pipeline.topology.model import Topology

DISTRIBUTION = "streaming-inference-pipeline"
DALI = ("nvidia.dali", "audio", "NVIDIA DALI")
MATPLOTLIB = ("matplotlib", "plot", "matplotlib")


class MissingExtra(ConfigError):
    """A feature's optional library is not installed."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (it is looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package (``nvidia``), a blocked import
        return False


def require(feature: str, library: tuple[str, str, str]) -> None:
    """Raise :class:`MissingExtra` unless ``library`` (module, extra, name) is installed."""
    module, extra, name = library
    if not installed(module):
        raise MissingExtra(f"{feature} needs {name}, which is not installed: pip install '{DISTRIBUTION}[{extra}]'")


def require_for_topology(topology: Topology, only: Sequence[str] = ()) -> None:
    """Fail early, before any service starts, when a selected stage needs a missing extra."""
    for stage in topology.stages:
        if stage.kind == "dali" and (not only or stage.name in only):
            require(f"stage {stage.name!r} (kind: dali)", DALI)
