"""``diskguard status``: the last deletion comes from the audit log too, not only from a
running daemon's ``state.json`` (issue 13 item 4: "last deletion: -" right after
``enforce --once`` deleted six segments)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from diskguard.commands import status as status_cmd
from diskguard.config import parse_config
from diskguard.host import fsusage
from support import cli
from support.configs import write_config
from support.disks import over_ceiling
from support.kafkagen import SegmentSpec, write_log_dir

MiB = 1024**2
BASE_TS = 1_700_000_000_000


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return cli.run_cli(*args, timeout=120, env={"COLUMNS": "400"})


def test_status_after_enforce_once_shows_its_last_deletion(
    tmp_path: Path, loop_ext4: Callable[..., Path]
) -> None:
    mount = loop_ext4(64 * MiB)
    log_dir = mount / "kafka-logs"
    parts = {
        (topic, p): [
            SegmentSpec(
                records=25,
                payload_size=10_000,
                first_timestamp_ms=BASE_TS + (s * 4 + t * 2 + p) * 60_000,
                timestamp_step_ms=10,
                records_per_batch=5,
            )
            for s in range(4)
        ]
        for t, topic in enumerate(["orders", "clicks"])
        for p in range(2)
    }
    write_log_dir(log_dir, parts)
    limit = over_ceiling(mount, 3, digits=1)
    cfg = write_config(
        tmp_path, log_dir, disk_usage_percent=limit, mode="offline", offline_headroom=0
    )
    enforced = run_cli("enforce", "--once", "-c", str(cfg))
    assert enforced.returncode == 0, enforced.stdout + enforced.stderr
    audit = [json.loads(x) for x in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    done = [x for x in audit if x["phase"] == "done"]
    assert len(done) >= 2, audit
    last = done[-1]

    proc = run_cli("status", "--json", "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["daemon_running"] is False
    (fs,) = status["filesystems"]
    assert fs["mount"] == str(mount)
    got = fs["last_deletion"]
    assert got is not None, "status forgot the deletions enforce --once just made"
    assert (got["topic"], got["partition"], got["base_offset"], got["bytes"], got["mode"]) == (
        last["topic"],
        last["partition"],
        last["base_offset"],
        last["bytes"],
        "offline",
    )
    assert got["ts"] == pytest.approx(dt.datetime.fromisoformat(last["ts"]).timestamp())

    text = run_cli("status", "-c", str(cfg))
    assert text.returncode == 0, text.stderr
    assert f"{last['topic']}-{last['partition']}@{last['base_offset']}" in text.stdout


# -------------------------------------------------------- the audit log and state.json merged


def _line(mount: str, phase: str, when: dt.datetime, offset: int, **extra: Any) -> str:
    fields = {
        "ts": when.isoformat(timespec="milliseconds"),
        "action_id": f"a{offset}-{phase}",
        "phase": phase,
        "mount": mount,
        "log_dir": f"{mount}/kafka-logs",
        "topic": "orders",
        "partition": 1,
        "base_offset": offset,
        "next_offset": offset + 10,
        "bytes": 4096 + offset,
        "mode": "offline",
        **extra,
    }
    return json.dumps(fields) + "\n"


@pytest.mark.parametrize("chunk", [37, 1 << 20])
def test_last_deletion_is_the_newest_done_line_of_the_mount_or_the_daemons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Only ``done`` segment deletions of that mount count (not intents, failures, refusals,
    sweeps, other mounts, damaged or torn lines); a running daemon's record wins when newer.
    Read in small chunks too, so lines straddle chunk boundaries."""
    monkeypatch.setattr(status_cmd, "_AUDIT_CHUNK", chunk)
    log_dir = tmp_path / "kafka-logs"
    log_dir.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    config = parse_config(
        {"broker": {"log_dirs": [str(log_dir)]}, "daemon": {"state_dir": str(state)}},
        tmp_path / "c.toml",
    )
    mount = fsusage.filesystem_usage(log_dir).mount
    t0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    at = [t0 + dt.timedelta(minutes=i) for i in range(10)]
    (state / "audit.jsonl").write_text(
        _line(mount, "intent", at[0], 100)
        + _line(mount, "done", at[1], 100)
        + _line(mount, "intent", at[2], 200)
        + _line(mount, "done", at[3], 200, mode="broker")
        + "{not json\n"
        + _line(mount, "failed", at[4], 300, error="boom")
        + _line(mount, "refused", at[5], 400, error=".lock held")
        + _line("/elsewhere", "done", at[6], 500)
        + _line(mount, "done", at[7], 0, kind="swept", what="delete_dir")
        + _line(mount, "intent", at[8], 600)
        + _line(mount, "done", at[9], 700)[:-1]  # torn: no newline, so never completed
    )

    def last() -> dict[str, Any] | None:
        (fs,) = status_cmd.collect_status(config)["filesystems"]
        result: dict[str, Any] | None = fs["last_deletion"]
        return result

    got = last()
    assert got == {
        "ts": at[3].timestamp(),
        "topic": "orders",
        "partition": 1,
        "base_offset": 200,
        "bytes": 4296,
        "mode": "broker",
    }
    # A running daemon (this process stands in for it) with an older record: the audit wins.
    older = {
        "ts": at[2].timestamp(),
        "topic": "clicks",
        "partition": 0,
        "base_offset": 5,
        "bytes": 10,
        "mode": "offline",
    }
    newer = {**older, "ts": at[9].timestamp() + 1}
    for daemon_last, want in ((older, got), (newer, newer)):
        (state / "state.json").write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "filesystems": {
                        mount: {
                            "flow_state": "normal",
                            "alert_level": 0,
                            "last_deletion": daemon_last,
                        }
                    },
                }
            )
        )
        assert last() == want
    # No audit log at all, no daemon: nothing to show, as before.
    (state / "audit.jsonl").unlink()
    (state / "state.json").unlink()
    assert last() is None


def test_set_aside_partitions_are_one_line_per_topic() -> None:
    """A broker's refusal sets aside every partition of the topic: status says so in one
    line per topic, with the refused partition's own error and the latest time."""
    denied = "TOPIC_AUTHORIZATION_FAILED: denied"
    sibling = f"{denied} (the answer for partition 1: it holds for the whole topic)"
    until = dt.datetime(2026, 11, 24, 12, 0, 0, tzinfo=dt.UTC).timestamp()
    entries = [
        {"topic": "orders", "partition": 1, "error": denied, "until": until},
        *(
            {"topic": "orders", "partition": p, "error": sibling, "until": until + p}
            for p in (0, 2, 3, 7)
        ),
        {"topic": "clicks", "partition": 4, "error": "EPERM", "until": until},
        {"topic": "views"},  # a hand-edited or truncated state.json
    ]
    lines = status_cmd.set_aside_lines(entries)
    assert lines == [
        "set aside (unreadable entry in state.json): {'topic': 'views'}",
        "orders, 5 partitions (0-3, 7): set aside (kept, not deleted) until 12:00:07 UTC or a "
        f"config reload: {denied}",
        "clicks-4: set aside (kept, not deleted) until 12:00:00 UTC or a config reload: EPERM",
    ]
    assert status_cmd.int_ranges([0, 2, 3, 4, 9, 10]) == "0, 2-4, 9-10"
