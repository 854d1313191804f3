"""``diskguard run``: the daemon (what the systemd unit starts)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from diskguard.cli import config_option, load_or_exit, no_traceback
from diskguard.logs import configure_logging


@click.command("run")
@config_option
@no_traceback
def run_command(config_path: Path) -> None:
    """Run the daemon: watch the log dirs, enforce limits, flow control, snapshots."""
    config = load_or_exit(config_path)
    # The daemon's event stream (run_daemon sets it up again, the same): structlog loaded now,
    # not at its first event, which comes in the middle of its first retention cycle.
    configure_logging(config.logging.format, config.logging.level, eager=True)
    from diskguard.daemon import run_daemon

    sys.exit(run_daemon(config))
