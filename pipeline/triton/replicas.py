"""Where a stage's Triton replicas are: a list of endpoints, or a DNS name of all of them.

``PIPELINE_TRITON_GRPC_URL`` (``triton.grpc_url`` in a topology) names one server, as
before, or several separated by commas (``triton-0:8001,triton-1:8001``). An entry
``dns:///name:port`` stands for every address ``name`` resolves to, looked up again
every ``resolve_every_s``: a Kubernetes headless Service, whose name resolves to the
ready pods' addresses (gRPC's own ``dns:///`` target spelling). One long-lived HTTP/2
channel to a normal Service sticks to one pod however many are added, which is why the
stateless stage keeps a channel per replica (:mod:`workers.stateless.fleet_backend`).

TLS and ``dns:///`` do not mix here: the replicas would be reached by address, and their
certificates name the Service. A list of ``grpcs://`` names does.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

from pipeline.errors import ConfigError
from pipeline.settings import TritonSettings

DNS_PREFIX = "dns:///"


@dataclass(frozen=True)
class ReplicaSpec:
    """The replicas a ``grpc_url`` names: fixed endpoints and DNS names to resolve."""

    endpoints: tuple[str, ...]
    dns_names: tuple[tuple[str, int], ...]

    @property
    def several(self) -> bool:
        """Whether this is a fleet (more than one endpoint, or any DNS name), not one server."""
        return len(self.endpoints) + len(self.dns_names) > 1 or bool(self.dns_names)

    async def resolve(self) -> list[str]:
        """Every endpoint, each DNS name's addresses included (``host:port``, IPv6 in
        brackets), without repeats, in a stable order. A name that does not resolve now
        contributes nothing (its pods may all be restarting); the caller keeps what it has."""
        found = list(self.endpoints)
        loop = asyncio.get_running_loop()
        for host, port in self.dns_names:
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError:
                continue
            for family, _type, _proto, _name, address in infos:
                ip = str(address[0])
                found.append(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
        return list(dict.fromkeys(found))


def replica_spec(grpc_url: str) -> ReplicaSpec:
    """Parse a ``grpc_url``: comma-separated endpoints and ``dns:///name:port`` entries (none
    when it is empty: the endpoint is not configured, which setting up says)."""
    endpoints: list[str] = []
    if not grpc_url.strip():
        return ReplicaSpec((), ())
    names: list[tuple[str, int]] = []
    for entry in (part.strip() for part in grpc_url.split(",")):
        if not entry:
            raise ConfigError(f"triton grpc_url {grpc_url!r} has an empty entry")
        if entry.startswith(DNS_PREFIX):
            host, sep, port = entry[len(DNS_PREFIX) :].rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(f"triton grpc_url entry {entry!r}: expected dns:///name:port")
            names.append((host, int(port)))
        else:
            endpoints.append(entry)
    if names and any(e.startswith("grpcs://") for e in endpoints):
        raise ConfigError("triton grpc_url: dns:/// entries cannot be mixed with grpcs:// (TLS names a host)")
    return ReplicaSpec(tuple(endpoints), tuple(names))


def replica_settings(settings: TritonSettings, endpoint: str) -> TritonSettings:
    """``settings`` pointed at one replica (TLS files, limits and keepalives kept)."""
    return settings.model_copy(update={"grpc_url": endpoint})


def one_server(settings: TritonSettings, what: str) -> TritonSettings:
    """``settings``, checked to name one server: for what does not spread over a fleet yet
    (a sequence stage, whose streams must each stay on one replica; routes; a shadow)."""
    if settings.grpc_url and replica_spec(settings.grpc_url).several:
        raise ConfigError(
            f"{what} takes one Triton endpoint, and triton grpc_url {settings.grpc_url!r} names several; "
            "only a stateless stage with one model spreads over replicas"
        )
    return settings
