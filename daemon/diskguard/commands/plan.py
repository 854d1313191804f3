"""``diskguard plan``: what would go, and why — a dry run of one retention cycle."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from diskguard.cli import cli, config_option, load_or_exit, no_traceback
from diskguard.enforcement import dumps, plan_json
from diskguard.planner import Plan
from diskguard.progress import progress
from diskguard.runtime import Runtime
from diskguard.units import format_bytes


def _ts(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def render_plan(chosen: Plan, mode: str, reason: str, warnings: list[str]) -> None:
    console = Console(file=sys.stdout, width=max(Console().width, 120))
    fs_table = Table(title=f"Filesystems (mode: {mode} — {reason})", title_justify="left")
    for col in (
        "mount",
        "device",
        "used",
        "avail",
        "usage",
        "limit",
        "target",
        "pending",
        "excess",
    ):
        fs_table.add_column(col, justify="right" if col not in ("mount", "device") else "left")
    for fs in chosen.filesystems:
        fs_table.add_row(
            fs.mount,
            fs.device,
            format_bytes(fs.used_bytes),
            format_bytes(fs.available_bytes),
            f"{fs.usage_percent:.2f}%",
            f"{fs.limit_percent:g}%",
            f"{fs.target_percent:g}%",
            format_bytes(fs.pending_reclaim_bytes),
            format_bytes(fs.excess_bytes) if fs.excess_bytes else "-",
        )
    console.print(fs_table)
    if not chosen.deletions:
        console.print("Nothing to delete: every filesystem is within its limit.")
    else:
        table = Table(
            title="Would delete, in this order (globally oldest first)", title_justify="left"
        )
        for col in (
            "#",
            "topic-partition",
            "base offset",
            "next offset",
            "newest record",
            "bytes",
            "why",
        ):
            table.add_column(col)
        for i, d in enumerate(chosen.deletions, 1):
            why = d.reason
            if d.unconsumed_records:
                groups = ", ".join(f"{g}: {n}" for g, n in sorted(d.unconsumed_records.items()))
                why += f"; UNCONSUMED by {groups}"
            if d.timestamp_source != "timeindex":
                why += f"; age from {d.timestamp_source}"
            table.add_row(
                str(i),
                f"{d.topic}-{d.partition}",
                str(d.base_offset),
                str(d.next_offset),
                _ts(d.max_timestamp_ms),
                format_bytes(d.bytes),
                why,
            )
        console.print(table)
        total = sum(d.bytes for d in chosen.deletions)
        console.print(f"{len(chosen.deletions)} segment(s), {format_bytes(total)}.")
    if chosen.protected:
        protected = Table(
            title="Protected topics (never deleted, whatever the usage)", title_justify="left"
        )
        protected.add_column("topic")
        protected.add_column("why")
        for topic in chosen.protected:
            protected.add_row(topic.topic, topic.reason)
        console.print(protected)
    for fs in chosen.filesystems:
        if not fs.reachable:
            console.print(
                f"[bold]{fs.mount}: {format_bytes(fs.unreachable_bytes)} of the excess cannot be "
                "freed: only active or protected segments are left.[/bold]"
            )
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


@cli.command("plan")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@no_traceback
def plan_command(config_path: Path, as_json: bool) -> None:
    """Show which segments a retention cycle would delete now, and why. Deletes nothing."""
    config = load_or_exit(config_path)
    with Runtime(config, read_only=True) as runtime, progress(None, "scanning") as advance:
        runtime.planner.on_partition = advance
        outcome = runtime.cycle(act=False)
    if as_json:
        data = plan_json(outcome.plan)
        data["mode"] = outcome.mode.mode
        data["mode_reason"] = outcome.mode.reason
        click.echo(dumps(data))
        for warning in outcome.warnings:
            click.echo(f"warning: {warning}", err=True)
    else:
        render_plan(outcome.plan, outcome.mode.mode, outcome.mode.reason, list(outcome.warnings))
