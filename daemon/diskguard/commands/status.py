"""``diskguard status``: what each guarded filesystem looks like right now.

Live numbers (statvfs, a names-only scan for pending reclaim, /proc for deleted-but-open
files) plus what the running daemon last wrote to ``<state_dir>/state.json`` (flow state,
alert level, last deletion). Works without the daemon: flow state is then computed from the
current usage and marked as such. The last deletion is also read from the audit log, so one
made by ``enforce --once`` or by a daemon that has since stopped shows too.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from diskguard.cli import config_option, load_or_exit, no_traceback
from diskguard.config import Config
from diskguard.flow.limits import flow_limits
from diskguard.flow.state import FlowState, step
from diskguard.host.openfiles import bytes_by_device, scan_deleted_open_files
from diskguard.kafkalog.model import FilesystemUsage, usage_fields
from diskguard.kafkalog.scan import scan
from diskguard.kafkalog.serverprops import find_metadata_log
from diskguard.retention.ceilings import Ceilings
from diskguard.retention.daemonstate import StateFileError, daemon_state
from diskguard.retention.reclaimwatch import reclaim_settings
from diskguard.retention.report import dumps
from diskguard.units import format_bytes, plural


def collect_status(config: Config) -> dict[str, Any]:
    result = scan([str(d) for d in config.broker.log_dirs], config.retention.protect_topics)
    warnings = list(result.warnings)
    try:
        daemon = daemon_state(config)
    except StateFileError as exc:
        daemon = None
        warnings.append(str(exc))
    open_scan = scan_deleted_open_files([fs.usage.mount for fs in result.filesystems])
    held = bytes_by_device(open_scan.files)
    filesystems = []
    settings = reclaim_settings(config)
    ceilings = Ceilings(config)
    for fs in result.filesystems:
        usage = fs.usage
        limits = flow_limits(config, usage.total_bytes)
        saved = daemon.filesystems.get(usage.mount) if daemon is not None else None
        if saved is not None:
            flow_state, alert_level = saved.flow_state, saved.alert_level
            last_deletion = asdict(saved.last_deletion) if saved.last_deletion else None
            source = "daemon"
        else:
            state, _ = step(FlowState(), usage, limits)
            flow_state = "overfull" if state.overfull else "normal"
            alert_level = state.alert_level or 0
            last_deletion = None
            source = "computed now (daemon not running)"
        reclaim = (asdict(saved.reclaim) if saved and saved.reclaim else None) or {
            "check_interval_s": settings.check_interval_s,
            "delete_delay_s": settings.delete_delay_s,
            "settings_source": settings.source,
            "latency_p50_s": None,
            "latency_max_s": None,
            "latency_samples": 0,
            "growth_bytes_per_s": None,
            "note": "daemon not running: settings only, nothing measured",
        }
        device_id = os.stat(usage.mount).st_dev
        open_files = [
            {"pid": f.pid, "comm": f.comm, "fd": f.fd, "path": f.path, "bytes": f.bytes}
            for f in open_scan.files
            if f.device == device_id
        ]
        filesystems.append(
            {
                **usage_fields(usage, [d.path for d in fs.log_dirs]),
                "usage_percent": round(usage.usage_percent, 3),
                "limit_percent": ceilings.limit_percent,
                "target_percent": ceilings.target_percent,
                "overfull_percent": limits.overfull_percent,
                "underfull_percent": limits.underfull_percent,
                "min_free_bytes": limits.min_free_bytes,
                "flow_state": flow_state,
                "alert_level": alert_level,
                "flow_state_source": source,
                "pending_reclaim_bytes": fs.pending_reclaim_bytes,
                "last_deletion": _latest_deletion(config, usage.mount, last_deletion),
                "deleted_open_bytes": held.get(device_id, 0),
                "deleted_open_files": open_files,
                "reclaim": reclaim,
            }
        )
    return {
        "daemon_running": daemon is not None,
        "filesystems": filesystems,
        "kraft_metadata": _metadata(config, result.filesystems),
        "ladder": ladder_record(config),
        "set_aside": [asdict(e) for e in daemon.set_aside] if daemon is not None else [],
        "unreadable_processes": open_scan.denied_pids,
        "warnings": warnings,
    }


def _metadata(config: Config, scanned: Any) -> dict[str, Any] | None:
    """Where the KRaft metadata log lives (a full ``metadata.log.dir`` halts the broker)."""
    found = find_metadata_log(config.broker.log_dirs, config.broker.server_properties)
    if found is None:
        return None
    mount = next(
        (
            fs.usage.mount
            for fs in scanned
            for d in fs.log_dirs
            if os.path.realpath(d.path) == os.path.realpath(found.log_dir)
        ),
        None,
    )
    return {
        "path": str(found.path),
        "log_dir": str(found.log_dir),
        "source": found.source,
        "mount": mount,
        "shares_data_disk": found.guarded,
    }


def ladder_record(config: Config) -> dict[str, Any]:
    """What the ladder changed on the cluster and has not undone yet (``ladder.json``)."""
    from diskguard.retention.ladderstate import LADDER_FILE, LadderState

    state = LadderState(Path(config.daemon.state_dir) / LADDER_FILE, persist=False)
    return {
        "lowered": {t: asdict(v) for t, v in state.lowered().items()},
        "moves": {k: asdict(m) for k, m in state.moves().items()},
        "cordoned": state.cordoned(),
        "move_rate_bytes_per_s": state.move_rate(),
        "problem": state.problem,
    }


def ladder_lines(status: dict[str, Any]) -> list[str]:
    """The human ``status``: where the metadata log is, and what the ladder holds changed."""
    lines = []
    meta = status.get("kraft_metadata")
    if meta:
        shared = "shares a guarded data disk" if meta["shares_data_disk"] else "not guarded"
        lines.append(f"KRaft metadata log: {meta['path']} ({meta['source']}; {shared})")
    ladder = status.get("ladder") or {}
    for topic, entry in sorted((ladder.get("lowered") or {}).items()):
        before = entry["previous"] if entry["previous"] is not None else "broker default"
        lines.append(
            f"tiered: {topic} {entry['key']} lowered to {entry['value']} ms (was {before}); "
            f"restored once {', '.join(entry['mounts'])} is back under its target"
        )
    for move in (ladder.get("moves") or {}).values():
        lines.append(
            f"moving: {move['topic']}-{move['partition']} {move['source_dir']} -> "
            f"{move['target_dir']} ({format_bytes(move['bytes'])})"
        )
    if ladder.get("cordoned"):
        lines.append(f"cordoned by diskguard: {', '.join(ladder['cordoned'])}")
    return lines


def over_limit(fs: dict[str, Any]) -> bool:
    """Is a status filesystem over its limit, by the trigger's rule (``over_ceiling``: usage
    above the limit) on the exact bytes? Its ``usage_percent`` is rounded to 3 decimals, so
    70.0004 % would read 70.0 at a 70 % limit; exactly at the limit is not over."""
    usage = FilesystemUsage(
        fs["mount"], fs["device"], fs["total_bytes"], fs["used_bytes"], fs["available_bytes"]
    )
    return usage.above(float(fs["limit_percent"]))


#: Redpanda-style alert levels: 1 low space, 2 degraded.
_ALERT_STYLES = {1: "yellow", 2: "bold red"}


def _render(status: dict[str, Any]) -> None:
    # rich only for the table a person reads: --json does not pay for importing it.
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=sys.stdout, width=max(Console().width, 120))
    running = "running" if status["daemon_running"] else "NOT running"
    table = Table(title=f"diskguard status (daemon {running})", title_justify="left")
    for col in (
        "mount",
        "usage",
        "limit",
        "flow",
        "alert",
        "pending",
        "deleted-open",
        "last deletion",
    ):
        table.add_column(col)
    for fs in status["filesystems"]:
        last = fs["last_deletion"]
        last_text = "-"
        if last:
            when = dt.datetime.fromtimestamp(last["ts"], tz=dt.UTC).strftime(
                "%Y-%m-%d %H:%M:%S UTC"
            )
            last_text = f"{when} {last['topic']}-{last['partition']}@{last['base_offset']}"
        # Over a limit stands out (rich drops the styles when stdout is not a terminal).
        over = over_limit(fs)
        table.add_row(
            fs["mount"],
            Text(
                f"{fs['usage_percent']:.2f}% ({format_bytes(fs['available_bytes'])} free)",
                style="bold red" if over else "",
            ),
            f"{fs['limit_percent']:g}%",
            Text(fs["flow_state"], style="bold red" if fs["flow_state"] == "overfull" else ""),
            Text(str(fs["alert_level"]), style=_ALERT_STYLES.get(fs["alert_level"], "")),
            format_bytes(fs["pending_reclaim_bytes"]),
            format_bytes(fs["deleted_open_bytes"]),
            last_text,
        )
    console.print(table)
    for fs in status["filesystems"]:
        for f in fs["deleted_open_files"][:10]:
            console.print(
                f"{fs['mount']}: {format_bytes(f['bytes'])} held by deleted file {f['path']} "
                f"open in pid {f['pid']} ({f['comm']}) fd {f['fd']} — df counts it, du does not"
            )
    for fs in status["filesystems"]:
        console.print(f"{fs['mount']}: {reclaim_line(fs['reclaim'])}")
    for line in ladder_lines(status):
        console.print(line, markup=False, highlight=False)
    for line in set_aside_lines(status["set_aside"]):
        console.print(line, markup=False, highlight=False)
    for warning in status["warnings"]:
        click.echo(f"warning: {warning}", err=True)


def set_aside_lines(entries: list[Any]) -> list[str]:
    """The partitions the daemon set aside (``retention.setaside``, read from state.json),
    one line per topic: a broker's refusal sets aside every partition of the topic, and a
    topic of 50 partitions should not take 50 lines. The error shown is the refused
    partition's own (the others' name it); the time, the latest of the topic's."""
    by_topic: dict[str, list[tuple[int, float, str]]] = {}
    lines = []
    for entry in entries:
        try:
            topic, partition = str(entry["topic"]), int(entry["partition"])
            until, error = float(entry["until"]), str(entry["error"])
            dt.datetime.fromtimestamp(until, tz=dt.UTC)
        except (TypeError, KeyError, ValueError, OverflowError, OSError):
            lines.append(f"set aside (unreadable entry in state.json): {entry!r}")
            continue
        by_topic.setdefault(topic, []).append((partition, until, error))
    for topic, parts in by_topic.items():
        latest = dt.datetime.fromtimestamp(max(u for _p, u, _e in parts), tz=dt.UTC)
        error = min((e for _p, _u, e in parts), key=len)
        numbers = sorted({p for p, _u, _e in parts})
        what = (
            f"{topic}-{numbers[0]}"
            if len(numbers) == 1
            else f"{topic}, {len(numbers)} partitions ({int_ranges(numbers)})"
        )
        lines.append(
            f"{what}: set aside (kept, not deleted) until {latest:%H:%M:%S} UTC or a config "
            f"reload: {error}"
        )
    return lines


def int_ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (sorted, distinct input)."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def reclaim_line(r: dict[str, Any]) -> str:
    """One sentence: the broker's reclaim latency, measured and configured, and the headroom."""
    text = (
        f"broker reclaim: retention check every {r['check_interval_s']:g} s + delete delay "
        f"{r['delete_delay_s']:g} s ({r['settings_source']}); measured p50 "
        f"{_seconds(r.get('latency_p50_s'))}, max {_seconds(r.get('latency_max_s'))} "
        f"over {plural(int(r.get('latency_samples', 0)), 'deletion')}"
    )
    rate = r.get("growth_bytes_per_s")
    if rate is not None:
        text += (
            f"; growing {format_bytes(int(rate))}/s, needs "
            f"{format_bytes(int(r.get('headroom_needed_bytes') or 0))} of headroom"
        )
    return text


@click.command("status")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@no_traceback
def status_command(config_path: Path, as_json: bool) -> None:
    """Usage, limits, flow state, alert level, pending reclaim, deleted-but-open files."""
    config = load_or_exit(config_path, writes=False)
    status = collect_status(config)
    if as_json:
        click.echo(dumps(status))
    else:
        _render(status)


#: How much of the audit log is read at a time, from its end backwards.
_AUDIT_CHUNK = 1 << 20


def _audit_lines_newest_first(path: Path) -> Iterator[bytes]:
    """The audit log's complete lines, newest first, read backwards in chunks: status wants
    only the newest deletion, and the log only grows (it is never rotated). A torn last line
    (power loss before its newline) is skipped, as ``audit.read_audit`` does."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - iterated lazily below
    except FileNotFoundError:
        return
    with fh:
        pos = fh.seek(0, os.SEEK_END)
        head = b""  # the start of the file's text before ``pos`` not yet split into lines
        skip_last = True  # what follows the last newline is torn (or empty)
        while pos > 0:
            size = min(_AUDIT_CHUNK, pos)
            pos -= size
            fh.seek(pos)
            parts = (fh.read(size) + head).split(b"\n")
            head, complete = parts[0], parts[1:]
            if skip_last and complete:
                complete, skip_last = complete[:-1], False
            yield from reversed(complete)
        if head and not skip_last:
            yield head


def _last_deletion_from_audit(config: Config, mount: str) -> dict[str, Any] | None:
    """The newest completed segment deletion on ``mount`` recorded in the audit log, in the
    shape the daemon writes to ``state.json``; None when there is none. ``state.json`` alone
    knows only what a daemon that is running now did."""
    # Local import: the audit log is read only here.
    from diskguard.retention.audit import AUDIT_FILE, DONE

    for raw in _audit_lines_newest_first(Path(config.daemon.state_dir) / AUDIT_FILE):
        if DONE.encode() not in raw:
            continue  # most lines are intents; no need to parse them
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if (
            not isinstance(line, dict)
            or line.get("phase") != DONE
            or line.get("kind") is not None  # a sweep, not a segment deletion
            or line.get("mount") != mount
        ):
            continue
        try:
            when = dt.datetime.fromisoformat(str(line.get("ts")))
        except ValueError:
            continue
        topic, partition, base_offset = (line.get(k) for k in ("topic", "partition", "base_offset"))
        if not (
            isinstance(topic, str) and isinstance(partition, int) and isinstance(base_offset, int)
        ):
            continue
        return {
            "ts": (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp(),
            "topic": topic,
            "partition": partition,
            "base_offset": base_offset,
            "bytes": line.get("bytes"),
            "mode": line.get("mode"),
        }
    return None


def _latest_deletion(
    config: Config, mount: str, from_daemon: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Whichever is newer: the running daemon's record or the audit log's."""
    from_audit = _last_deletion_from_audit(config, mount)
    if from_daemon is None or from_audit is None:
        return from_daemon or from_audit
    daemon_ts = from_daemon.get("ts")
    if isinstance(daemon_ts, int | float) and daemon_ts >= from_audit["ts"]:
        return from_daemon
    return from_audit
