"""The ``shared_memory`` option of a stateless stage: large tensors through Triton's
system shared memory instead of inside the gRPC message.

Its own module so the stage model (``model.py``) only gains one field. The run-time
side is :mod:`pipeline.triton.shared_memory`; this is only what the topology says.
"""

from __future__ import annotations

from typing import Literal

from pydantic import PositiveInt

from pipeline.topology.fields import _Strict


class SharedMemoryConfig(_Strict):
    """How a stateless stage hands its batch tensors to Triton.

    ``off`` (the default) sends every tensor inside the gRPC message, exactly as before
    the option existed: shared memory only works when Triton sees this process's
    ``/dev/shm`` (same host and IPC namespace), which a URL alone cannot promise.
    """

    mode: Literal["auto", "on", "off"] = "off"
    """auto = on when the Triton URL is a loopback address and a probe registration succeeds,
    else off (logged once); on = the same checks, and the stage refuses to start when they
    fail; off = every tensor inside the gRPC message."""
    threshold_bytes: PositiveInt = 256 * 1024
    """Tensors of a batch (inputs, and outputs whose size the model fixes) of at least this
    many bytes go through shared memory; smaller ones stay in the message."""
