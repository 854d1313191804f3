"""``diskguard enforce --once``: one retention cycle for cron, rescue scripts and CI checks."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from diskguard.cli import config_option, fail, load_or_exit, no_traceback
from diskguard.errors import ExitCode
from diskguard.logs import configure_logging
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.daemonstate import daemon_memory
from diskguard.retention.outcome import CycleOutcome
from diskguard.units import format_bytes, plural


@click.command("enforce")
@config_option
@click.option("--once", is_flag=True, help="Run one cycle and exit (required).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="JSON event lines on stdout even on a terminal (the default when not on one).",
)
@no_traceback
def enforce_command(config_path: Path, once: bool, as_json: bool) -> None:
    """Run one retention cycle, then exit.

    Exit 0: every filesystem at/under its limit as measured after the cycle (in broker mode
    net of what the broker will still remove); 1: limit unreachable, a deletion failed, or
    still over the limit; 2: config/usage error; 3: refused for safety (offline while another
    process holds a log dir's .lock — nothing touched).
    """
    if not once:
        fail("enforce needs --once (use `diskguard run` for the daemon)", ExitCode.USAGE)
    config = load_or_exit(config_path)
    human = sys.stdout.isatty() and not as_json
    if human:
        # A person: readable events on stderr, one summary line on stdout at the end.
        configure_logging("console", config.logging.level, stream=sys.stderr, eager=True)
    else:
        # Cron, scripts, CI: the JSON event stream on stdout, as the daemon writes it.
        configure_logging(config.logging.format, config.logging.level, eager=True)
    with RetentionCycle(config) as retention:
        retention.daemon_rates, set_aside = daemon_memory(config)
        retention.inputs.set_aside.load(set_aside, time.monotonic(), time.time())
        outcome = retention.run(act=True)
    for warning in outcome.warnings:
        click.echo(f"warning: {warning}", err=True)
    code = outcome.exit_code()
    if code == 3:
        click.echo(f"diskguard: refused: {outcome.mode.reason}", err=True)
    elif code == 1:
        for fs in outcome.plan.filesystems:
            if outcome.at_or_under_limit(fs):
                continue
            usage = outcome.usage_after(fs)
            now = f"{usage.usage_percent:.1f}%" if usage is not None else "unknown (statvfs failed)"
            pending = outcome.pending_after(fs)
            more = f", {pending} bytes still to be removed by the broker" if pending else ""
            click.echo(
                f"diskguard: {fs.mount}: over its {fs.limit_percent}% limit after the cycle: "
                f"{now} measured{more}",
                err=True,
            )
    if human:
        click.echo(summary(outcome, code))
    sys.exit(code)


def summary(outcome: CycleOutcome, code: int) -> str:
    """One line for a person at a terminal: what the cycle did and where each disk stands."""
    done = [r for r in outcome.results if r.ok]
    freed = sum(r.freed_bytes for r in done)
    what = (
        f"{plural(len(done), 'segment')} deleted ({format_bytes(freed)}, {outcome.mode.mode})"
        if done
        else f"nothing deleted ({outcome.mode.mode})"
    )
    if outcome.failed:
        what += f", {plural(len(outcome.failed), 'deletion')} failed"
    disks = []
    for fs in outcome.plan.filesystems:
        after = outcome.usage_after(fs)
        now = f"{after.usage_percent:.1f}%" if after is not None else "?"
        mark = "" if outcome.at_or_under_limit(fs) else " OVER"
        disks.append(
            f"{fs.mount} {fs.usage_percent:.1f}% → {now} (limit {fs.limit_percent:g}%){mark}"
        )
    return f"diskguard enforce: {what}; " + "; ".join(disks) + f"; exit {code}"
