"""``diskguard reserve``: how much the topics here may grow to, against the disks' capacity.

IBM Event Streams' reserved-size method (see ``diskguard.capacity.reserve``). The command only
reports: a total above 90% is a warning on stderr with exit 0, because the broker keeps
working and the operator may well rely on time retention or diskguard's own limit; a
monitoring job that wants to alert reads ``over_limit`` from ``--json``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from diskguard.capacity.reserve import ReserveReport, TopicReserve, reserve_report
from diskguard.capacity.topicconfigs import TopicInventory, load_topics
from diskguard.cli import config_option, fail, load_or_exit, no_traceback
from diskguard.errors import ExitCode
from diskguard.host import fsusage
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import configure_logging
from diskguard.units import format_bytes, plural


def _filesystems(log_dirs: list[Path]) -> list[FilesystemUsage]:
    """Each filesystem under the log dirs once, however many log dirs share it."""
    seen: dict[tuple[str, str], FilesystemUsage] = {}
    for log_dir in log_dirs:
        usage = fsusage.filesystem_usage(log_dir)
        seen.setdefault((usage.mount, usage.device), usage)
    return list(seen.values())


def _capacity(usage: FilesystemUsage) -> int:
    # What the (non-root) broker can ever fill: df's Used + Avail, root's reserve excluded.
    return usage.used_bytes + usage.available_bytes


def _topic_json(row: TopicReserve) -> dict[str, Any]:
    s = row.settings
    per = row.per_partition
    return {
        "topic": s.topic,
        "partitions": s.partitions,
        "cleanup_policy": s.cleanup_policy,
        "policy": row.policy,
        "retention_bytes": s.retention_bytes,
        "segment_bytes": s.segment_bytes,
        "segment_index_bytes": s.segment_index_bytes,
        "unbounded": row.unbounded,
        "per_partition_bytes": per.total_bytes if per else None,
        "per_partition_data_bytes": per.data_bytes if per else None,
        "per_partition_index_bytes": per.index_bytes if per else None,
        "reserved_bytes": row.reserved_bytes,
        "settings_source": s.source,
    }


def report_json(
    report: ReserveReport, inventory: TopicInventory, filesystems: list[FilesystemUsage]
) -> dict[str, Any]:
    percent = report.percent
    return {
        "source": inventory.source,
        "notes": list(inventory.notes),
        "topics": [_topic_json(r) for r in report.topics],
        "unbounded_topics": [r.settings.topic for r in report.unbounded],
        "total_reserved_bytes": report.total_bytes,
        "capacity_bytes": report.capacity_bytes,
        "filesystems": [
            {"mountpoint": fs.mount, "device": fs.device, "capacity_bytes": _capacity(fs)}
            for fs in filesystems
        ],
        "reserved_percent": None if percent is None else round(percent, 3),
        "limit_percent": report.limit_percent,
        "over_limit": report.over_limit,
    }


def _size(n: int) -> str:
    return "unlimited" if n < 0 else format_bytes(n)


def render_table(
    report: ReserveReport, inventory: TopicInventory, filesystems: list[FilesystemUsage]
) -> None:
    width = shutil.get_terminal_size((140, 24)).columns
    console = Console(file=sys.stdout, width=max(width, 120))
    title = f"Reserved size per topic (IBM Event Streams method; settings from {inventory.source})"
    table = Table(title=title, title_justify="left")
    for col in ("topic", "partitions", "policy", "retention", "segment", "seg. index"):
        table.add_column(col, justify="left" if col in ("topic", "policy") else "right")
    table.add_column("per partition", justify="right")
    table.add_column("reserved", justify="right")
    for row in report.topics:
        s = row.settings
        per = row.per_partition
        table.add_row(
            s.topic,
            str(s.partitions),
            s.cleanup_policy,
            _size(s.retention_bytes),
            format_bytes(s.segment_bytes),
            format_bytes(s.segment_index_bytes),
            format_bytes(per.total_bytes) if per else "-",
            format_bytes(row.reserved_bytes) if row.reserved_bytes is not None else "UNBOUNDED",
        )
    console.print(table)
    for fs in filesystems:
        console.print(f"filesystem {fs.mount} ({fs.device}): {format_bytes(_capacity(fs))}")
    percent = report.percent
    shown = "n/a" if percent is None else f"{percent:.1f}%"
    console.print(
        f"total reserved: {format_bytes(report.total_bytes)} of "
        f"{format_bytes(report.capacity_bytes)} capacity = {shown} "
        f"(limit {report.limit_percent:g}%)"
    )
    if report.unbounded:
        names = ", ".join(r.settings.topic for r in report.unbounded)
        console.print(
            f"{plural(len(report.unbounded), 'topic')} with retention.bytes=-1 can grow without "
            f"bound and are not in the total: {names}"
        )
    for note in inventory.notes:
        console.print(f"note: {note}")


@click.command("reserve")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the broker before falling back to the log dirs.",
)
@no_traceback
def reserve(config_path: Path, as_json: bool, timeout: float) -> None:
    """Reserved size of every topic (IBM Event Streams method) vs. the log dirs' disks.

    Exit 0 even above the 90% limit (a warning on stderr); exit 2 for bad config.
    """
    config = load_or_exit(config_path, writes=False)
    # Logs go to stderr: stdout is the report (and must stay pure JSON with --json).
    configure_logging(config.logging.format, config.logging.level, stream=sys.stderr)
    inventory = load_topics(config.broker, timeout=timeout)  # TopicConfigError: exit 2
    filesystems = _filesystems(list(config.broker.log_dirs))
    try:
        report = reserve_report(inventory.topics, sum(_capacity(fs) for fs in filesystems))
    except ValueError as exc:
        fail(str(exc), ExitCode.USAGE)
    if as_json:
        click.echo(json.dumps(report_json(report, inventory, filesystems), indent=2))
    else:
        render_table(report, inventory, filesystems)
    if report.over_limit:
        click.echo(
            f"diskguard: warning: topics may reserve {report.percent:.1f}% of the log dirs' "
            f"capacity, above {report.limit_percent:g}%",
            err=True,
        )
