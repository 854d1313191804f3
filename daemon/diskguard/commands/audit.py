"""``diskguard audit``: what diskguard deleted, when, why — read from the append-only audit log.

Each action is one row: its intent joined with its outcome, so a crash between the two shows
up as "no outcome recorded" rather than disappearing. ``--explain topic-partition@offset``
says in a sentence why that segment went, and why before the next candidate, from the
``why`` its audit line carries (``retention.order.Why``).

Exit codes: 0; 1 when ``--explain`` finds no action on that segment (one line says so);
2 for a malformed ``--explain`` argument (one line).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from diskguard.cli import config_option, fail, load_or_exit, no_traceback
from diskguard.errors import ExitCode
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
from diskguard.retention.order import order_text
from diskguard.units import format_bytes, format_timestamp_ms_utc


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
        kind = out.get("kind")
        if kind == "restore":
            return "restored"
        if kind == "evict":
            return f"requested; broker drops {format_bytes(freed)} locally (kept remote)"
        if kind == "move":
            return f"requested; broker moves {format_bytes(freed)}"
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


def _why(line: Mapping[str, Any]) -> dict[str, Any] | None:
    """The line's ``why`` (written since the audit line carries one), else None."""
    why = line.get("why")
    return why if isinstance(why, dict) else None


def _order(line: Mapping[str, Any]) -> str:
    why = _why(line)
    if why is None or not isinstance(why.get("rank"), int):
        return "-"
    return order_text(why["rank"], why.get("before"), why.get("tie_breaker"))


#: ``--explain``'s argument: ``topic-partition@base_offset`` (a topic may contain ``-``).
_SEGMENT = re.compile(r"^(?P<topic>[A-Za-z0-9._-]+)-(?P<partition>[0-9]+)@(?P<offset>[0-9]+)$")

#: Why the segment came before the next candidate, by ``tie_breaker``, for a sentence.
_TIE_SENTENCE = {
    "older": "its newest record is older",
    "consumed": "as old, but every consumer group had read it and some group had not read "
    "the other",
    "led_here": "as old and as read, but this broker leads its partition",
    "name": "all else equal, by topic, partition and offset",
}


def parse_segment(value: str) -> tuple[str, int, int]:
    """``topic-partition@offset`` -> ``(topic, partition, base offset)``; exit 2 if not."""
    match = _SEGMENT.match(value)
    if match is None:
        fail(
            f"--explain: not topic-partition@offset: {value!r} (e.g. orders-3@120400, the "
            "segment's base offset)"
        )
    return match["topic"], int(match["partition"]), int(match["offset"])


def _pct(value: Any) -> str:
    return f"{value:g} %" if isinstance(value, int | float) else "?"


def explain(action: AuditAction) -> str:
    """One action on a segment as a sentence: what went, when, why, why before the next
    candidate, and what came of it. Lines written before the audit line carried a ``why``
    say what they have (the rule, the usage before)."""
    line = action.first
    when = _ts(line)
    name = f"{line.get('topic')}-{line.get('partition')}@{line.get('base_offset')}"
    size = format_bytes(int(line.get("bytes") or 0))
    newest = line.get("max_timestamp_ms")
    aged = f", newest record {format_timestamp_ms_utc(newest)}" if isinstance(newest, int) else ""
    at = when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if when else "an unknown time"
    head = f"{name} ({size}{aged}) was chosen at {at}, mode {line.get('mode', '?')}"
    why = _why(line)
    mount = line.get("mount", "?")
    if why is None:
        cause = (
            f"rule {line.get('rule', '?')}, {mount} at {_pct(line.get('usage_before_percent'))} "
            "(no more recorded: the line predates the audit log's why)"
        )
        return f"{head}: {cause}. Outcome: {_outcome(action)}."
    excess = format_bytes(int(why.get("excess_bytes") or 0))
    if why.get("rule") == "max_bytes":
        cause = (
            f"its log dir {line.get('log_dir', '?')} held {excess} more Kafka data than its "
            f"retention.max_bytes budget of {format_bytes(int(why.get('max_bytes') or 0))}"
        )
    else:
        limit, target = _pct(why.get("limit_percent")), _pct(why.get("target_percent"))
        if why.get("trigger") == "predicted":
            now = (
                f"was predicted at {_pct(why.get('predicted_usage_percent'))} by the time "
                f"the broker frees what is asked now (measured {_pct(why.get('usage_percent'))})"
            )
        else:
            now = f"was at {_pct(why.get('usage_percent'))} (measured)"
        cause = (
            f"{mount} {now}, over its {limit} limit, and {excess} had to go to bring it to "
            f"its {target} target"
        )
    rank, before = why.get("rank"), why.get("before")
    order = f"It was #{rank} in the global order, oldest first"
    if before is None:
        order += ", the last candidate left"
    else:
        reason = _TIE_SENTENCE.get(str(why.get("tie_breaker")), _TIE_SENTENCE["name"])
        order += f", ahead of {before} because {reason}"
    return f"{head}: {cause}. {order}. Outcome: {_outcome(action)}."


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
        "order",
        "outcome",
        "unconsumed",
    ):
        table.add_column(col, justify="right" if col in ("base offset", "bytes") else "left")
    for action in actions:
        line = action.first
        when = _ts(line)
        swept = line.get("kind") == SWEPT
        rung = _rung(line)
        table.add_row(
            when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if when else "?",
            str(line.get("mode", "?")),
            # A sweep names a dir (a -delete dir, or the partition dir of *.deleted files).
            Path(str(line.get("path", "?"))).name
            if swept
            else rung[0]
            if rung
            else f"{line.get('topic', '?')}-{line.get('partition', '?')}",
            "-" if swept or rung else str(line.get("base_offset", "?")),
            format_bytes(int(line.get("bytes") or 0)),
            f"swept {line.get('what', '')}".strip()
            if swept
            else rung[1]
            if rung
            else str(line.get("rule") or line.get("reason", "")),
            "-" if rung else _order(line),
            _outcome(action),
            _unconsumed(line),
        )
    console.print(table)


def _rung(line: Mapping[str, Any]) -> tuple[str, str] | None:
    """A lossless rung's line (the ladder: ``evict``, ``restore``, ``move``): what it names
    and what it did, in a few words; None for a deletion or a sweep."""
    kind = line.get("kind")
    topic = line.get("topic", "?")
    if kind == "evict":
        return str(topic), f"tiered: {line.get('key')} -> {line.get('value')}"
    if kind == "restore":
        back = line.get("value")
        return str(topic), f"tiered: {line.get('key')} restored to {back or 'broker default'}"
    if kind == "move":
        where = Path(str(line.get("target_dir", "?")))
        return f"{topic}-{line.get('partition', '?')}", f"balance: moved to {where}"
    return None


@click.command("audit")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw audit lines (JSON).")
@click.option("--since", default=None, help="Only actions at or after this ISO 8601 time.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the last N actions.")
@click.option(
    "--explain",
    "segment",
    default=None,
    metavar="TOPIC-PARTITION@OFFSET",
    help="Why this segment went (and before which), as a sentence; exit 1 if not found.",
)
@no_traceback
def audit_command(
    config_path: Path, as_json: bool, since: str | None, limit: int | None, segment: str | None
) -> None:
    """Show what diskguard deleted (or tried to), when and why."""
    wanted = parse_segment(segment) if segment is not None else None
    config = load_or_exit(config_path, writes=False)
    since_at = parse_since(since) if since is not None else None
    path = Path(config.daemon.state_dir) / AUDIT_FILE
    actions = pair_actions(list(read_audit(path)))
    if wanted is not None:
        _explain(actions, wanted, path)
        return
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


def _explain(actions: list[AuditAction], wanted: tuple[str, int, int], path: Path) -> None:
    """Every action on the segment, oldest first, one sentence each; exit 1 if none."""
    topic, partition, offset = wanted
    found = [
        a
        for a in actions
        if a.first.get("kind") is None
        and a.first.get("topic") == topic
        and a.first.get("partition") == partition
        and a.first.get("base_offset") == offset
    ]
    if not found:
        fail(f"no deletion of {topic}-{partition}@{offset} in {path}", ExitCode.FAILED)
    for action in found:
        click.echo(explain(action))
