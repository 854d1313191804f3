"""``diskguard audit``: what diskguard deleted, when, why — read from the append-only audit log.

Each action is one row: its intent joined with its outcome, so a crash between the two shows
up as "no outcome recorded" rather than disappearing.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from diskguard.cli import config_option, fail, load_or_exit, no_traceback
from diskguard.retention.audit import (
    AUDIT_FILE,
    DONE,
    FAILED,
    REFUSED,
    SWEPT,
    AuditAction,
    pair_actions,
    read_audit,
)
from diskguard.units import format_bytes


def parse_since(value: str) -> dt.datetime:
    """ISO 8601 date or date-time; naive values are UTC (the audit log's own zone)."""
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        fail(
            f"--since: not an ISO 8601 time: {value!r} (e.g. 2024-05-01 or 2024-05-01T12:00:00Z)",
        )
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _ts(line: Mapping[str, Any]) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(str(line.get("ts", "")))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _outcome(action: AuditAction) -> str:
    out = action.outcome
    if out is None:
        return "no outcome recorded (interrupted?)"
    phase = out.get("phase")
    freed = int(out.get("freed_bytes") or 0)
    recovered = " after crash recovery" if out.get("recovered") else ""
    if phase == DONE:
        if out.get("mode") == "broker":
            return f"requested; broker frees {format_bytes(freed)}"
        return f"deleted, freed {format_bytes(freed)}{recovered}"
    if phase in (FAILED, REFUSED):
        return f"{phase}: {out.get('error') or 'no reason recorded'}"
    return str(phase)


def _unconsumed(line: Mapping[str, Any]) -> str:
    groups = line.get("unconsumed_records") or {}
    if not isinstance(groups, dict) or not groups:
        return "-"
    return ", ".join(f"{g}: {n}" for g, n in sorted(groups.items()))


def render(actions: list[AuditAction]) -> None:
    console = Console(file=sys.stdout, width=max(Console().width, 140))
    table = Table(title="Audit log (oldest first)", title_justify="left")
    for col in (
        "time (UTC)",
        "mode",
        "topic-partition",
        "base offset",
        "bytes",
        "reason",
        "outcome",
        "unconsumed",
    ):
        table.add_column(col, justify="right" if col in ("base offset", "bytes") else "left")
    for action in actions:
        line = action.first
        when = _ts(line)
        swept = line.get("kind") == SWEPT
        table.add_row(
            when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if when else "?",
            str(line.get("mode", "?")),
            # A sweep names a dir (a -delete dir, or the partition dir of *.deleted files).
            Path(str(line.get("path", "?"))).name
            if swept
            else f"{line.get('topic', '?')}-{line.get('partition', '?')}",
            "-" if swept else str(line.get("base_offset", "?")),
            format_bytes(int(line.get("bytes") or 0)),
            f"swept {line.get('what', '')}".strip()
            if swept
            else str(line.get("rule") or line.get("reason", "")),
            _outcome(action),
            _unconsumed(line),
        )
    console.print(table)


@click.command("audit")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw audit lines (JSON).")
@click.option("--since", default=None, help="Only actions at or after this ISO 8601 time.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the last N actions.")
@no_traceback
def audit_command(config_path: Path, as_json: bool, since: str | None, limit: int | None) -> None:
    """Show what diskguard deleted (or tried to), when and why."""
    config = load_or_exit(config_path, writes=False)
    since_at = parse_since(since) if since is not None else None
    path = Path(config.daemon.state_dir) / AUDIT_FILE
    actions = pair_actions(list(read_audit(path)))
    if not actions:
        # On stderr with --json, so stdout stays a (here empty) stream of JSON lines.
        click.echo("no deletions recorded yet", err=as_json)
        return
    if since_at is not None:
        actions = [a for a in actions if (when := _ts(a.first)) is not None and when >= since_at]
    if limit is not None:
        actions = actions[-limit:]
    if as_json:
        for action in actions:
            for line in action.lines:
                click.echo(json.dumps(line, sort_keys=False))
        return
    if not actions:
        click.echo("no deletions recorded in that range")
        return
    render(actions)
