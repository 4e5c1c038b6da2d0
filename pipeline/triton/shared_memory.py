"""Large batch tensors through Triton's system shared memory (``/dev/shm``).

When Triton runs on this host, a 1 MB input costs a protobuf copy on each side
and a trip through the gRPC stack; in a shared-memory region it costs one
``memcpy``. Each stateless stage owns a :class:`RegionPool`: regions created and
registered with Triton once, each taken by one batch at a time (so
``max_inflight_batches`` batches never share one), grown on demand, unregistered
and destroyed on shutdown. Everything that touches a region goes through
``tritonclient.utils.shared_memory`` and the client's ``*_system_shared_memory``
calls; this module only decides names, sizes, offsets and what to do on failure.

Names: ``pipeline-<stage>-<pid namespace>-<pid>-<n>`` is both the Triton region
name and the ``/dev/shm`` key. A process killed with SIGKILL cannot clean up, so at
start-up every pool removes, from Triton's registry and from ``/dev/shm``, the
regions of our prefix whose process is gone (same pid namespace, pid not alive).
The pid namespace is in the name because a pid means nothing across namespaces
(two containers sharing one Triton and one ``/dev/shm``).

Failure rule: a batch whose shared-memory call fails (Triton restarted and forgot
the registration, a region it cannot map) is sent again inside the gRPC message
at once and its region re-registered on next use. It is counted
(``pipeline_triton_shared_memory_total{outcome="fallback"}``) and logged once; it is
never retried as a failure nor dead-lettered for that reason.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tritonclient.grpc.aio as triton_aio
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from pipeline.errors import ConfigError
from pipeline.processes import pid_alive

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
PREFIX = "pipeline-"
_NAME = re.compile(r"^pipeline-(?P<stage>.+)-(?P<ns>\d+)-(?P<pid>\d+)-(?P<n>\d+)$")
# Tensors start on cache-line boundaries inside a region.
ALIGN = 64

Mode = Literal["auto", "on", "off"]
Infer = Callable[[list[InferInput], list[InferRequestedOutput]], Awaitable[Any]]


@dataclass(frozen=True)
class SharedMemoryOptions:
    """A stage's choice (the topology's ``shared_memory`` section, as plain settings)."""

    mode: Mode = "off"
    threshold_bytes: int = 256 * 1024


@dataclass(frozen=True)
class OutputSpec:
    """A requested output and, when the model fixes it, its byte size for this batch."""

    name: str
    byte_size: int | None  # None: variable shape or BYTES, so it travels in the message


# ---------------------------------------------------------------------------- names


def pid_namespace() -> int:
    """The inode of this process's pid namespace (0 when /proc does not say)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def region_name(stage: str, pid: int, n: int, namespace: int | None = None) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", stage)[:100]
    return f"{PREFIX}{safe}-{pid_namespace() if namespace is None else namespace}-{pid}-{n}"


def is_stale(name: str, stage: str, namespace: int, alive: Callable[[int], bool] = pid_alive) -> bool:
    """A region of ours whose process is gone, or one this very process left under this
    stage's name (its pid was reused: we have created none yet)."""
    match = _NAME.match(name)
    if match is None or int(match["ns"]) != namespace:
        return False
    pid = int(match["pid"])
    if pid == os.getpid():
        return match["stage"] == re.sub(r"[^A-Za-z0-9_.-]", "_", stage)[:100]
    return not alive(pid)


def is_local(grpc_target: str) -> bool:
    """``host:port`` names a loopback address (where ``/dev/shm`` can be Triton's too)."""
    host = grpc_target.rpartition(":")[0].strip("[]") or grpc_target
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def remove_stale_files(stage: str, namespace: int) -> list[str]:
    """Unlink our stale segments from ``/dev/shm`` (a plain unlink: tritonclient can only
    destroy a region through a handle of its own); the names removed."""
    removed = []
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        if is_stale(path.name, stage, namespace):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def output_specs(outputs: Sequence[tuple[str, str, Sequence[int]]], rows: int | None) -> list[OutputSpec]:
    """Byte sizes of outputs ``(name, datatype, per-item shape)`` for a batch of ``rows``
    (None: the model does not batch). Unknown for BYTES or a variable dimension."""
    specs = []
    for name, datatype, shape in outputs:
        if datatype == "BYTES" or any(d < 0 for d in shape):
            specs.append(OutputSpec(name, None))
            continue
        items = math.prod(shape) * (rows if rows is not None else 1)  # np.prod: 5 µs a call
        specs.append(OutputSpec(name, items * np.dtype(triton_to_np_dtype(datatype)).itemsize))
    return specs


def is_shared_memory_failure(exc: BaseException) -> bool:
    """Triton refused the call because of a region (unknown, too small, unmappable)."""
    return isinstance(exc, InferenceServerException) and "shared memory" in str(exc).lower()


# ---------------------------------------------------------------------------- regions


@dataclass(eq=False)
class Region:
    name: str
    handle: Any  # tritonclient.utils.shared_memory.SharedMemoryRegion
    byte_size: int
    registered: bool = False


class RegionPool:
    """The registered regions of one stage in this process."""

    def __init__(
        self,
        client: triton_aio.InferenceServerClient,
        stage: str,
        options: SharedMemoryOptions,
        count: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.client, self.stage, self.options, self.count = client, stage, options, count
        self._free: list[Region] = []
        self._all: list[Region] = []
        self._created = 0
        self._warned = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self, grpc_target: str) -> bool:
        """Clean stale regions, then probe: register one region. False (logged once) when
        shared memory cannot work here in ``auto`` mode; a :class:`ConfigError` in ``on``."""
        if not is_local(grpc_target):
            return self._refuse(f"Triton at {grpc_target} is not a loopback address")
        try:
            await self.clean_stale()
            region = await self._new(self.options.threshold_bytes)
        except (InferenceServerException, shm.SharedMemoryException, OSError) as exc:
            return self._refuse(f"probe registration failed: {exc}")
        self._free.append(region)
        log.info("%s: tensors of %d bytes or more go through Triton system shared memory",
                 self.stage, self.options.threshold_bytes)
        return True

    def _refuse(self, why: str) -> bool:
        if self.options.mode == "on":
            raise ConfigError(f"stage {self.stage}: shared_memory mode on, but {why}")
        log.info("%s: shared memory off (%s); tensors travel inside the gRPC message", self.stage, why)
        return False

    async def clean_stale(self) -> None:
        """Unregister and unlink regions left by processes killed before their shutdown."""
        namespace = pid_namespace()
        status = await self.client.get_system_shared_memory_status()
        for name in list(status.regions):
            if is_stale(name, self.stage, namespace):
                await self.client.unregister_system_shared_memory(name)
                log.info("%s: unregistered stale shared-memory region %s", self.stage, name)
        for name in await asyncio.to_thread(remove_stale_files, self.stage, namespace):
            log.info("%s: removed stale %s/%s", self.stage, SHM_DIR, name)

    async def close(self) -> None:
        """Unregister and destroy every region (the batches are over)."""
        for region in self._all:
            if region.registered:
                try:
                    await self.client.unregister_system_shared_memory(region.name)
                except InferenceServerException as exc:  # Triton gone: nothing left to unregister
                    log.debug("%s: unregister %s: %s", self.stage, region.name, exc)
            shm.destroy_shared_memory_region(region.handle)
        self._all.clear()
        self._free.clear()

    # ------------------------------------------------------------------ regions
    async def _new(self, byte_size: int) -> Region:
        name = region_name(self.stage, os.getpid(), self._created)
        self._created += 1
        handle = shm.create_shared_memory_region(name, "/" + name, byte_size, create_only=True)
        region = Region(name, handle, byte_size)
        self._all.append(region)
        try:
            await self._register(region)
        except BaseException:
            self._drop(region)
            raise
        return region

    async def _register(self, region: Region) -> None:
        await self.client.register_system_shared_memory(region.name, "/" + region.name, region.byte_size)
        region.registered = True

    def _drop(self, region: Region) -> None:
        self._all.remove(region)
        shm.destroy_shared_memory_region(region.handle)

    async def acquire(self, byte_size: int) -> Region:
        """A registered region of at least ``byte_size`` bytes, for one batch only.
        A free region too small is replaced by one twice the size needed (amortised growth)."""
        fits = [r for r in self._free if r.byte_size >= byte_size]
        if fits:
            region = min(fits, key=lambda r: r.byte_size)
            self._free.remove(region)
            if not region.registered:
                try:
                    await self._register(region)
                except BaseException:
                    self._free.append(region)
                    raise
                self.count("reregistered")
            return region
        if self._free:
            smallest = min(self._free, key=lambda r: r.byte_size)
            self._free.remove(smallest)
            if smallest.registered:
                await self.client.unregister_system_shared_memory(smallest.name)
            self._drop(smallest)
        return await self._new(max(2 * byte_size, self.options.threshold_bytes))

    def release(self, region: Region) -> None:
        self._free.append(region)

    async def forget(self, region: Region) -> None:
        """Triton refused ``region``: unregister what may be left, register again on next use."""
        region.registered = False
        try:
            await self.client.unregister_system_shared_memory(region.name)
        except InferenceServerException:
            pass

    def warn_once(self, message: str, *args: object) -> None:
        if not self._warned:
            self._warned = True
            log.warning(message + " (logged once; see pipeline_triton_shared_memory_total)", *args)
        else:
            log.debug(message, *args)

    # ------------------------------------------------------------------ one batch
    async def infer(
        self, arrays: Mapping[str, tuple[np.ndarray, str]], outputs: Sequence[OutputSpec], call: Infer
    ) -> tuple[Any, dict[str, np.ndarray | None]]:
        """One call with tensors of ``threshold_bytes`` or more in a region; on a
        shared-memory failure (or none to be had) the same call inside the message."""
        threshold = self.options.threshold_bytes
        big_in = [n for n, (a, dt) in arrays.items() if dt != "BYTES" and a.nbytes >= threshold]
        big_out = [o for o in outputs if o.byte_size is not None and o.byte_size >= threshold]
        if not big_in and not big_out:
            return await message_infer(arrays, outputs, call)
        needed = sum(aligned(arrays[n][0].nbytes) for n in big_in) + sum(aligned(o.byte_size or 0) for o in big_out)
        try:
            region = await self.acquire(needed)
        except (InferenceServerException, shm.SharedMemoryException, OSError) as exc:
            self.count("fallback")
            self.warn_once("%s: no shared-memory region (%s); batch sent inside the gRPC message", self.stage, exc)
            return await message_infer(arrays, outputs, call)
        try:
            inputs, offset = [], 0
            for name, (array, datatype) in arrays.items():
                tensor = InferInput(name, list(array.shape), datatype)
                if name in big_in:
                    shm.set_shared_memory_region(region.handle, [np.ascontiguousarray(array)], offset)
                    tensor.set_shared_memory(region.name, array.nbytes, offset)
                    offset += aligned(array.nbytes)
                else:
                    tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            requested, placed = [], {}
            for spec in outputs:
                out = InferRequestedOutput(spec.name)
                if spec in big_out and spec.byte_size is not None:
                    out.set_shared_memory(region.name, spec.byte_size, offset)
                    placed[spec.name] = offset
                    offset += aligned(spec.byte_size)
                requested.append(out)
            try:
                response = await call(inputs, requested)
            except InferenceServerException as exc:
                if not is_shared_memory_failure(exc):
                    raise
                await self.forget(region)
                self.count("fallback")
                self.warn_once("%s: Triton refused region %s (%s); batch sent inside the gRPC message",
                               self.stage, region.name, exc)
                return await message_infer(arrays, outputs, call)
            results: dict[str, np.ndarray | None] = {}
            for spec in outputs:
                if spec.name in placed:
                    meta = response.get_output(spec.name)
                    dtype = triton_to_np_dtype(meta.datatype)
                    # A copy: the region serves the next batch as soon as this one returns.
                    view = shm.get_contents_as_numpy(region.handle, dtype, list(meta.shape), placed[spec.name])
                    results[spec.name] = np.array(view, copy=True)
                else:
                    results[spec.name] = response.as_numpy(spec.name)
            self.count("shm")
            return response, results
        finally:
            self.release(region)


async def message_infer(
    arrays: Mapping[str, tuple[np.ndarray, str]], outputs: Sequence[OutputSpec], call: Infer
) -> tuple[Any, dict[str, np.ndarray | None]]:
    """Every tensor inside the gRPC message (the behaviour without shared memory)."""
    inputs = []
    for name, (array, datatype) in arrays.items():
        tensor = InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    response = await call(inputs, [InferRequestedOutput(o.name) for o in outputs])
    results: dict[str, np.ndarray | None] = {o.name: response.as_numpy(o.name) for o in outputs}
    return response, results
