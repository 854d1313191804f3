"""``diskguard enforce --once``: one retention cycle for cron, rescue scripts and CI checks."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from diskguard.cli import EXIT_USAGE, cli, config_option, fail, load_or_exit, no_traceback
from diskguard.logs import configure_logging
from diskguard.runtime import Runtime, daemon_rates


@cli.command("enforce")
@config_option
@click.option("--once", is_flag=True, help="Run one cycle and exit (required).")
@no_traceback
def enforce_command(config_path: Path, once: bool) -> None:
    """Run one retention cycle, then exit.

    Exit 0: every filesystem at/under its limit (or its excess already on its way out);
    1: limit unreachable or a deletion failed; 2: config/usage error; 3: refused for safety
    (offline while another process holds a log dir's .lock — nothing touched).
    """
    if not once:
        fail("enforce needs --once (use `diskguard run` for the daemon)", EXIT_USAGE)
    config = load_or_exit(config_path)
    configure_logging(config.logging.format, config.logging.level)
    with Runtime(config) as runtime:
        runtime.daemon_rates = daemon_rates(config)
        outcome = runtime.cycle(act=True)
    for warning in outcome.warnings:
        click.echo(f"warning: {warning}", err=True)
    code = outcome.exit_code()
    if code == 3:
        click.echo(f"diskguard: refused: {outcome.mode.reason}", err=True)
    sys.exit(code)
