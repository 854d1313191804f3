"""``diskguard check-config``: validate the config; with ``--connect``, reach the broker too."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from diskguard.cli import config_option, load_or_exit, no_traceback
from diskguard.config import Config
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
    where = metadata_line(config)
    if where is not None:
        click.echo(f"{config_path}: {where}")
    if not connect:
        return
    from diskguard.connectcheck import connect_checks

    checks = connect_checks(config)
    for check in checks:
        click.echo(f"{'ok' if check.ok else 'FAIL'}: {check.line}")
    if not all(check.ok for check in checks):
        sys.exit(ExitCode.USAGE)


def metadata_line(config: Config) -> str | None:
    """Where the KRaft metadata log lives, and what that means for this guard (None: not
    found, e.g. ZooKeeper mode or a broker not formatted yet: nothing to say)."""
    from diskguard.kafkalog.serverprops import find_metadata_log

    found = find_metadata_log(config.broker.log_dirs, config.broker.server_properties)
    if found is None:
        return None
    if found.guarded:
        return (
            f"KRaft metadata log: {found.path} ({found.source}), on a guarded data disk: "
            "never deleted or moved; metadata_log_at_risk when that disk fills (a full "
            "metadata.log.dir halts the broker)"
        )
    return (
        f"KRaft metadata log: {found.path} ({found.source}), not on a guarded disk: "
        "diskguard does not watch it"
    )
