"""Local TCP ports for the servers a test starts (brokers, Prometheus, metrics endpoints)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
