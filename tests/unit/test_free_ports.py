"""Ports for the embedded stack's services are picked together and never repeat
(pipeline/embedded/process.py): a Triton given one port for gRPC and metrics refuses to start."""

from __future__ import annotations

import socket

from pipeline.embedded.process import free_port, free_ports


def test_ports_picked_together_are_distinct_and_free() -> None:
    for _ in range(200):
        ports = free_ports(6)
        assert len(set(ports)) == 6
    for port in free_ports(3) + [free_port()]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # nothing holds it any more
