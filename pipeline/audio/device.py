"""Where DALI runs: resolved once, at start-up, never at import time.

Importing DALI does not touch CUDA; asking it how many devices it sees does, so
that question is asked only when a stage starts (:func:`resolve_device`), and
its answer is kept for logs and as a metric label.
"""

from __future__ import annotations

import logging
from typing import Literal

from pipeline.errors import ConfigError

Device = Literal["cpu", "gpu"]
DeviceRequest = Literal["auto", "cpu", "gpu"]

log = logging.getLogger(__name__)


def cuda_device_count() -> int:
    """CUDA devices DALI can use; 0 when there is no driver, no device, or any error asking."""
    try:
        from nvidia.dali import backend

        return int(backend.GetCUDADeviceCount())  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - no driver, no libcuda, a broken install: "none"
        log.debug("DALI sees no CUDA device: %s", exc)
        return 0


def resolve_device(requested: str) -> Device:
    """``auto``: ``gpu`` when DALI sees a CUDA device, else ``cpu``.

    ``gpu`` with no device is a :class:`~pipeline.errors.ConfigError`, not a silent fallback.
    """
    if requested not in ("auto", "cpu", "gpu"):
        raise ConfigError(f"DALI device must be 'auto', 'cpu' or 'gpu', not {requested!r}")
    if requested == "cpu":
        return "cpu"
    if cuda_device_count() > 0:
        return "gpu"
    if requested == "gpu":
        raise ConfigError("DALI device 'gpu' was requested but DALI sees no CUDA device")
    return "cpu"
