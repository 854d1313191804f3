"""The daemon (``diskguard run``): the loop and what it watches, measures and writes.
The top layer: may import config, retention, flow, snapshots, host and kafkalog."""

from diskguard.daemon.loop import run_daemon

__all__ = ["run_daemon"]
