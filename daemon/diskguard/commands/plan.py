"""``diskguard plan``: what would go, and why — a dry run of one retention cycle."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from diskguard import cli, planstart
from diskguard.cli import config_option, load_or_exit, no_traceback
from diskguard.host.forked import Worker
from diskguard.kafkalog.listing import ListingCache
from diskguard.progress import progress
from diskguard.retention.ceilings import has_byte_budget
from diskguard.retention.mode import DRY_RUN, OFFLINE, REFUSED
from diskguard.retention.order import order_text
from diskguard.retention.report import dumps_ascii, ladder_json, plan_json
from diskguard.units import MAX_DATETIME_MS, format_bytes, format_timestamp_ms_utc, plural

if TYPE_CHECKING:
    from diskguard.config import Config
    from diskguard.kafkalog.model import Filesystem
    from diskguard.retention.ladder import LadderPlan
    from diskguard.retention.outcome import CycleOutcome
    from diskguard.retention.planner import Deletion, Plan


def far_future_note(deletions: Sequence[Deletion]) -> str | None:
    """Say how segments stamped past year 9999 were ordered, when there are any: Kafka's time
    retention compares the raw largest timestamp, so to it (and to the planner) they are the
    youngest of all, whatever the producer meant."""
    count = sum(1 for d in deletions if d.max_timestamp_ms > MAX_DATETIME_MS)
    if not count:
        return None
    return (
        f"{plural(count, 'segment')} {'carries' if count == 1 else 'carry'} timestamps past"
        " year 9999 (producers sending µs?). Like "
        "Kafka's time retention, diskguard orders by the raw largest timestamp, so they count "
        "as the youngest and go last."
    )


def unconsumed_text(d: Deletion) -> str:
    """``group: records`` per group that has not read all of the segment; a group that consumes
    the topic but never committed on this partition is named as such (it has read none)."""
    return ", ".join(
        f"{g}: no committed offset (all {n})" if g in d.groups_without_offset else f"{g}: {n}"
        for g, n in sorted(d.unconsumed_records.items())
    )


def blockers(
    chosen: Plan,
    mode: str,
    reason: str,
    scanned: Sequence[Filesystem] = (),
    warnings: Sequence[str] = (),
) -> list[str]:
    """One short sentence per filesystem the plan leaves over its limit, saying what blocks it.

    Derived from the plan and the mode only (plus, from the scan, which topics are protected):
    "Nothing to delete: every filesystem is within its limit" printed for a full disk sent
    operators looking for a bug in the wrong place.
    """
    by_mount = {fs.usage.mount: fs for fs in scanned}
    lines: list[str] = []
    for fs in chosen.filesystems:
        if not fs.over_usage_limit and fs.excess_bytes <= 0:
            continue
        if fs.halted:
            lines.append(f"{fs.mount}: over its limit but nothing will be deleted: {fs.halted}.")
            continue
        if fs.excess_bytes <= 0:
            pending = format_bytes(fs.pending_reclaim_bytes)
            lines.append(
                f"{fs.mount}: over its {fs.limit_percent:g}% limit, but the {pending} the "
                "offline sweep removes first (-delete dirs, *.deleted files) covers the "
                "excess; no live segment goes."
                if mode == OFFLINE
                else f"{fs.mount}: over its {fs.limit_percent:g}% limit, but the {pending} "
                "already pending reclaim covers the excess (on its way out, not freed yet); "
                "nothing more to delete."
            )
            continue
        if not fs.reachable:
            left = _what_is_left(by_mount.get(fs.mount), warnings)
            if fs.chosen_count == 0:
                lines.append(f"{fs.mount}: over its limit but nothing can be deleted: {left}.")
            else:
                lines.append(
                    f"{fs.mount}: {format_bytes(fs.unreachable_bytes)} of the excess cannot be "
                    f"freed: {left}."
                )
        if fs.chosen_count and mode == REFUSED:
            lines.append(f"{fs.mount}: nothing will be deleted: retention refused ({reason}).")
        elif fs.chosen_count and mode == DRY_RUN:
            lines.append(f"{fs.mount}: nothing will be deleted: retention.mode = dry-run.")
    return lines


def _what_is_left(fs: Filesystem | None, warnings: Sequence[str] = ()) -> str:
    """Once every candidate is chosen only active segments, protected topics and segments
    whose deletion would free nothing remain; say which, naming a few protected topics that
    still hold closed segments."""
    if fs is None:
        from diskguard.retention.stuck import UNREACHABLE_DETAIL

        return UNREACHABLE_DETAIL
    dirs = tuple(f"{d.path}/" for d in fs.log_dirs)
    kept = [w for w in warnings if w.startswith(dirs)]
    if any("extents shared" in w for w in kept):
        return (
            "the oldest segments left share their extents with a snapshot or reflinked copies "
            "(deleting them frees nothing; see the warnings), the rest are active or protected"
        )
    if any("hard-linked elsewhere" in w for w in kept):
        return (
            "the oldest segments left are hard-linked elsewhere too (deleting them frees "
            "nothing; see the warnings), the rest are active or protected"
        )
    protected = sorted(
        {
            p.topic
            for d in fs.log_dirs
            for p in d.partitions
            if p.protected and len(p.base_offsets) > 1
        }
    )
    if not protected:
        return "only active segments are left"
    names = ", ".join(protected[:3]) + (
        f" and {len(protected) - 3} more" if len(protected) > 3 else ""
    )
    return f"only active segments and protected topics ({names}) are left"


def render_plan(
    chosen: Plan,
    mode: str,
    reason: str,
    warnings: list[str],
    scanned: Sequence[Filesystem] = (),
    ladder: LadderPlan | None = None,
) -> None:
    # rich only for the table a person reads: --json does not pay for importing it.
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

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
            # Over the limit stands out (no styles when stdout is not a terminal): by the
            # trigger's rule on the exact bytes, not on the rounded ``usage_percent``.
            Text(
                f"{fs.usage_percent:.2f}%",
                style="bold red" if fs.over_usage_limit else "",
            ),
            f"{fs.limit_percent:g}%",
            f"{fs.target_percent:g}%",
            format_bytes(fs.pending_reclaim_bytes),
            Text(format_bytes(fs.excess_bytes), style="bold red") if fs.excess_bytes else "-",
        )
    console.print(fs_table)
    for line in forecast_lines(chosen, mode):
        console.print(line)
    for line in ladder_lines(ladder, chosen):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for fs in chosen.filesystems:
        if mode == OFFLINE and fs.pending_reclaim_bytes and fs.excess_bytes > 0:
            console.print(
                f"{fs.mount}: pending is what the offline sweep removes first (-delete dirs, "
                "*.deleted files); the segments below are for what remains."
            )
    blocked = blockers(chosen, mode, reason, scanned, warnings)
    if not chosen.deletions:
        console.print(
            "Nothing to delete."
            if blocked
            else "Nothing to delete: every filesystem is within its limit."
        )
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
            if d.why is not None:
                why += f"; {order_text(d.why.rank, d.why.before, d.why.tie_breaker)}"
            if d.unconsumed_records:
                why += f"; UNCONSUMED by {unconsumed_text(d)}"
            if d.timestamp_source != "timeindex":
                why += f"; age from {d.timestamp_source}"
            table.add_row(
                str(i),
                f"{d.topic}-{d.partition}",
                str(d.base_offset),
                str(d.next_offset),
                format_timestamp_ms_utc(d.max_timestamp_ms),
                format_bytes(d.bytes),
                why,
            )
        console.print(table)
        total = sum(d.bytes for d in chosen.deletions)
        console.print(f"{plural(len(chosen.deletions), 'segment')}, {format_bytes(total)}.")
        note = far_future_note(chosen.deletions)
        if note:
            console.print(note)
    if chosen.protected:
        protected = Table(
            title="Protected topics (never deleted, whatever the usage)", title_justify="left"
        )
        protected.add_column("topic")
        protected.add_column("why")
        for topic in chosen.protected:
            protected.add_row(topic.topic, topic.reason)
        console.print(protected)
    if chosen.not_live:
        kept = Table(title="Partition dirs that are not live (never deleted)", title_justify="left")
        for col in ("dir", "bytes", "why"):
            kept.add_column(col)
        for dir_ in chosen.not_live:
            kept.add_row(os.path.basename(dir_.path), format_bytes(dir_.bytes), dir_.reason)
        console.print(kept)
    for line in blocked:
        console.print(line, style="bold", markup=False, highlight=False, soft_wrap=True)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def ladder_lines(ladder: LadderPlan | None, chosen: Plan) -> list[str]:
    """The ladder, lossless first: per filesystem which rung frees what and when, then each
    eviction and move (deletions follow in their own table)."""
    if ladder is None or not (ladder.evictions or ladder.moves):
        return []
    lines = []
    for fs in chosen.filesystems:
        steps = [
            f"{r.rung} {format_bytes(r.bytes)} in ~{r.latency_s:.0f} s"
            for r in ladder.steps.get(fs.mount, ())
        ]
        if fs.chosen_count:
            steps.append(f"delete {format_bytes(fs.chosen_bytes)}")
        if steps:
            lines.append(f"{fs.mount}: the ladder: {'; then '.join(steps)}")
    for ev in ladder.evictions:
        lines.append(
            f"tiered: {ev.topic} local.retention.ms -> {ev.local_retention_ms} "
            f"({plural(len(ev.segments), 'uploaded segment')}, {format_bytes(ev.bytes)}, "
            f"up to {format_timestamp_ms_utc(ev.cutoff_ms)}): dropped locally at the broker's "
            "next retention check, still read from remote storage; restored once the disk "
            "is back under its target"
        )
    for move in ladder.moves:
        lines.append(
            f"move: {move.topic}-{move.partition} {move.source_dir} -> {move.target_dir} "
            f"({format_bytes(move.bytes)}, ~{move.expected_s:.0f} s): nothing lost"
        )
    return lines


#: What broker mode's DeleteRecords really does, said wherever it acts (plan, audit, README).
CLUSTER_SCOPE = (
    "broker mode trims cluster-wide: DeleteRecords moves each chosen partition's log start "
    "offset on every replica, not only on this broker's disk"
)


def forecast_lines(chosen: Plan, mode: str) -> list[str]:
    """Broker mode: the rate and reclaim latency each filesystem's trigger rests on."""
    if mode != "broker":
        return []
    lines = []
    for fs in chosen.filesystems:
        if fs.latency_source == "none" and not fs.growth_bytes_per_s:
            continue
        how = (
            "next retention check (phase seen) + delete delay"
            if fs.latency_source == "measured"
            else "worst case: a whole retention-check period + delete delay"
        )
        rate = (
            f"{format_bytes(int(fs.growth_bytes_per_s))}/s"
            if fs.growth_bytes_per_s
            else "unknown (no running daemon has measured it)"
        )
        trigger = " — over the ceiling by prediction" if fs.predicted_trigger else ""
        lines.append(
            f"{fs.mount}: growing {rate}; space asked now is freed in "
            f"~{fs.reclaim_latency_s:.1f} s ({how}); "
            f"predicted usage then {fs.predicted_usage_percent:.2f}%{trigger}"
        )
    if chosen.deletions:
        lines.append(f"Note: {CLUSTER_SCOPE}.")
        others: dict[int, int] = {}
        for d in chosen.deletions:
            for broker in d.also_trims:
                others[broker] = others.get(broker, 0) + 1
        if others:
            lines.append(
                "These trims also shorten the replicas on "
                + ", ".join(
                    f"broker {b} ({plural(n, 'segment')})" for b, n in sorted(others.items())
                )
                + "."
            )
    return lines


@click.command("plan")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@no_traceback
def plan_command(config_path: Path, as_json: bool) -> None:
    """Show which segments a retention cycle would delete now, and why. Deletes nothing."""
    config = load_or_exit(config_path, writes=False)
    # The collector off (in the worker too): what a plan makes lives until it exits and holds
    # no cycles; ~200 passes over it cost ~25 ms of a warm 100k-segment plan.
    with cli.collector_paused():
        outcome, listings = _plan(config)
        if as_json:
            data = plan_json(outcome.plan)
            data["ladder"] = ladder_json(outcome.ladder, outcome.plan)
            data["mode"] = outcome.mode.mode
            data["mode_reason"] = outcome.mode.reason
            data["scope"] = CLUSTER_SCOPE if outcome.mode.mode == "broker" else "local"
            # Not click.echo: off a terminal it runs an ANSI-stripping regex over all of it
            # (~7 ms for a 10,000-deletion plan's 4.9 MB), and JSON holds no escape codes.
            cli.write_out(dumps_ascii(data))
            for warning in outcome.warnings:
                click.echo(f"warning: {warning}", err=True)
        else:
            scanned, warnings = outcome.scan.filesystems, list(outcome.warnings)
            mode = outcome.mode
            render_plan(outcome.plan, mode.mode, mode.reason, warnings, scanned, outcome.ladder)
        # After the output: what this plan listed afresh, for the next one (``listingstore``).
        if listings is not None and listings.to_keep is not None:
            from diskguard.kafkalog import listingstore

            listingstore.save(config.daemon.state_dir, listings.to_keep)
    cli.leave_process()


def _plan(config: Config) -> tuple[CycleOutcome, ListingCache | None]:
    # Forked first, while this process has no other thread (the Kafka client's would make a
    # fork unsafe); it starts listing before this process loads the cycle's modules (from the
    # command's first moment where ``launch.main`` started it: ``planstart``). With a broker, a
    # second child asks it what needs kafka-python (``earlylogdirs``). Also the listings, for
    # the next plan to take where their dirs are unchanged.
    full = has_byte_budget(config)
    early = planstart.take(config, full)
    if early is not None:
        worker: Worker | None
        worker, listings = early
    else:
        worker = Worker.start()
        listings = ListingCache.started(config.broker.log_dirs, full, worker, planstart.DATE_AHEAD)
    asker = Worker.start() if worker is not None and config.broker.bootstrap_servers else None
    log_dirs = None
    if asker is not None:
        from diskguard.retention.earlylogdirs import ask_in_child

        log_dirs = ask_in_child(config, asker)
    from diskguard.retention.cycle import RetentionCycle
    from diskguard.retention.daemonstate import daemon_memory

    taken_over = daemon_memory(config)
    if taken_over.problem:
        click.echo(f"warning: {taken_over.problem}", err=True)
    try:
        with (
            progress(None, "scanning") as advance,
            RetentionCycle(
                config,
                read_only=True,
                taken_over=taken_over,
                on_partition=advance,
                worker=worker,
                listings=listings,
                log_dirs=log_dirs,
            ) as retention,
        ):
            return retention.plan(), listings
    finally:
        for child in (worker, asker):
            if child is not None:
                # The command's own process leaves right after its output (leave_process).
                child.close(reap=not cli.leaves_at_once())
