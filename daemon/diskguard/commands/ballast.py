"""``diskguard ballast``: release, inspect or (re)create the emergency space reserve.

``release`` is the command an operator types when the disk is already full, so it does as
little as possible: delete the file, say how much came free, and leave a marker so the
daemon does not fill the space again before the filesystem has cleared overfull.
"""

from __future__ import annotations

from pathlib import Path

import click

from diskguard.cli import (
    config_option,
    fail,
    load_or_exit,
    no_traceback,
)
from diskguard.config import Config
from diskguard.errors import ExitCode
from diskguard.flow.ballast import Ballast
from diskguard.flow.limits import flow_limits
from diskguard.host import fsusage
from diskguard.units import format_bytes


def _ballast(config_path: Path) -> tuple[Config, Ballast]:
    config = load_or_exit(config_path)
    if config.ballast.path is None:
        fail(f"{config_path}: ballast.path: not set, there is no ballast file")
    return config, Ballast(config.ballast, Path(config.daemon.state_dir))


@click.group("ballast")
def ballast_group() -> None:
    """The ballast file: space reserved for emergencies (``[ballast] path, size``)."""


@ballast_group.command("release")
@config_option
@no_traceback
def release(config_path: Path) -> None:
    """Delete the ballast now to free its space (recreated after the next overfull_cleared)."""
    _config, ballast = _ballast(config_path)
    freed = ballast.release()
    click.echo(
        f"released ballast {ballast.path}: freed {format_bytes(freed)} ({freed} bytes); "
        "the daemon recreates it after the filesystem's next overfull_cleared "
        "(or run `diskguard ballast create`)"
    )


@ballast_group.command("status")
@config_option
@no_traceback
def status(config_path: Path) -> None:
    """Show whether the ballast is in place, how much it holds, and whether it was released.

    Having no ballast is a valid setup, so this says so and exits 0; ``release`` and
    ``create`` cannot do what they are asked without one and exit 2."""
    config = load_or_exit(config_path)
    if config.ballast.path is None:
        click.echo("no ballast configured (ballast.path is not set)")
        return
    ballast = Ballast(config.ballast, Path(config.daemon.state_dir))
    st = ballast.status()
    line = (
        f"ballast {st.path}: {st.state}, {format_bytes(st.allocated_bytes)} allocated "
        f"of {format_bytes(st.size)}"
    )
    info = ballast.released_info()
    if info is not None:
        line += f"; released at {info.get('released_at')} (waiting for overfull_cleared)"
    click.echo(line)


@ballast_group.command("create")
@config_option
@no_traceback
def create(config_path: Path) -> None:
    """Forget a release and create the ballast now, unless that would make the disk overfull.

    Exit 0 when the ballast is in place, 3 when refused (it would cross a flow-control limit),
    1 when allocation failed.
    """
    config, ballast = _ballast(config_path)
    assert ballast.path is not None
    ballast.rearm()
    where = ballast.path.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    usage = fsusage.filesystem_usage(where)
    result = ballast.ensure(usage, flow_limits(config, usage.total_bytes))
    if result.state in ("present", "created"):
        click.echo(
            f"ballast {result.path}: {result.state}, "
            f"{format_bytes(result.allocated_bytes)} allocated"
        )
    elif result.state == "refused":
        fail(f"ballast {result.path}: refused: {result.reason}", ExitCode.REFUSED)
    else:
        fail(f"ballast {result.path}: {result.state}: {result.reason}", ExitCode.FAILED)
