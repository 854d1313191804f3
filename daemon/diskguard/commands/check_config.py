"""``diskguard check-config``: validate the config; with ``--connect``, reach the broker too."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from diskguard.cli import config_option, load_or_exit, no_traceback
from diskguard.errors import ExitCode
from diskguard.units import plural


@click.command("check-config")
@config_option
@click.option(
    "--connect",
    is_flag=True,
    help="Also reach the broker and check what each configured feature needs.",
)
@no_traceback
def check_config(config_path: Path, connect: bool) -> None:
    """Validate the config: exit 0 when valid, 2 with one line per problem otherwise.

    With --connect: reach the broker, learn its reclaim latency and the headroom the disks
    need at the current write rate; exit 2 when a configured feature cannot work.
    """
    config = load_or_exit(config_path)
    dirs = ", ".join(str(d) for d in config.broker.log_dirs)
    count = plural(len(config.broker.log_dirs), "log dir")
    click.echo(f"{config_path}: ok ({count}: {dirs})")
    if not connect:
        return
    from diskguard.connectcheck import connect_checks

    checks = connect_checks(config)
    for check in checks:
        click.echo(f"{'ok' if check.ok else 'FAIL'}: {check.line}")
    if not all(check.ok for check in checks):
        sys.exit(ExitCode.USAGE)
