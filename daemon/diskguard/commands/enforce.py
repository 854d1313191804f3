"""``diskguard enforce --once``: one retention cycle for cron, rescue scripts and CI checks."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from diskguard.cli import config_option, fail, load_or_exit, no_traceback
from diskguard.errors import ExitCode
from diskguard.logs import configure_logging
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.daemonstate import daemon_memory
from diskguard.retention.outcome import CycleOutcome, another_round, enforce_exit_code
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

    If the broker or the filesystem refuses a partition's deletion for good (an ACL denying
    DELETE, an immutable file) and the disk is still over its limit, the cycle plans again
    at once without that partition, as the daemon's next cycle would.

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
    taken_over = daemon_memory(config)
    if taken_over.problem:
        click.echo(f"warning: {taken_over.problem}", err=True)
    with RetentionCycle(config, taken_over=taken_over) as retention:
        rounds = enforce_rounds(retention)
    outcome = rounds[-1]
    for warning in outcome.warnings:
        click.echo(f"warning: {warning}", err=True)
    code = enforce_exit_code(rounds)
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
            if fs.halted:
                more += f"; {fs.halted}"
            failed = [r for o in rounds for r in o.failed if r.deletion.mount == fs.mount]
            if failed:
                # The cause, not only the result: "over its limit" alone reads like a plan
                # that found nothing to delete.
                more += f"; {plural(len(failed), 'deletion')} failed: {failed[-1].error}"
            click.echo(
                f"diskguard: {fs.mount}: over its {fs.limit_percent}% limit after the cycle: "
                f"{now} measured{more}",
                err=True,
            )
    if human:
        click.echo(summary(rounds, code))
    sys.exit(code)


def enforce_rounds(retention: RetentionCycle) -> list[CycleOutcome]:
    """The cycle, then at once another while the last one set partitions aside and left
    their filesystem over its limit (``another_round``): what the daemon's next cycle would
    do, within this one run."""
    rounds = [retention.enforce()]
    while another_round(rounds):
        rounds.append(retention.enforce())
    return rounds


def summary(rounds: Sequence[CycleOutcome], code: int) -> str:
    """One line for a person at a terminal: what the run did (all its rounds) and where each
    disk stands, from before the first round to after the last."""
    first, last = rounds[0], rounds[-1]
    results = [r for o in rounds for r in o.results]
    done = [r for r in results if r.ok]
    freed = sum(r.freed_bytes for r in done)
    what = (
        f"{plural(len(done), 'segment')} deleted ({format_bytes(freed)}, {last.mode.mode})"
        if done
        else f"nothing deleted ({last.mode.mode})"
    )
    failed = len(results) - len(done)
    if failed:
        what += f", {plural(failed, 'deletion')} failed"
    if len(rounds) > 1:
        what += f", {len(rounds)} rounds (partitions set aside)"
    before = {fs.mount: fs.usage_percent for fs in first.plan.filesystems}
    disks = []
    for fs in last.plan.filesystems:
        after = last.usage_after(fs)
        now = f"{after.usage_percent:.1f}%" if after is not None else "?"
        mark = "" if last.at_or_under_limit(fs) else " OVER"
        was = before.get(fs.mount, fs.usage_percent)
        disks.append(f"{fs.mount} {was:.1f}% → {now} (limit {fs.limit_percent:g}%){mark}")
    return f"diskguard enforce: {what}; " + "; ".join(disks) + f"; exit {code}"
