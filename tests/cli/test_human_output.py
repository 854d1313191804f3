"""Human output where a human looks (issue 13 item 7): on a terminal, values over a limit
stand out (bold red) and timestamps carry their time zone; piped, no ANSI codes at all."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from diskguard.commands import plan as plan_cmd
from diskguard.commands import status as status_cmd
from support.configs import write_config
from support.fsfixtures import fill
from support.kafkagen import SegmentSpec, write_log_dir
from support.terminal import on_a_terminal

MiB = 1024**2
BASE_TS = 1_700_000_000_000
BOLD_RED = "\x1b[1;31m"


def _piped(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"}
    )


def _over_the_limit(tmpfs: Callable[[int], Path], tmp_path: Path) -> Path:
    """A log dir on a filesystem whose usage is over the configured ceiling."""
    mount = tmpfs(32 * MiB)
    log_dir = mount / "kafka-logs"
    spec = SegmentSpec(
        records=20, payload_size=5_000, first_timestamp_ms=BASE_TS, timestamp_step_ms=10
    )
    write_log_dir(log_dir, {("orders", 0): [spec, spec, spec]})
    fill(mount / "filler", 20 * MiB)
    return write_config(tmp_path, log_dir, name="c.toml", disk_usage_percent=10, mode="offline")


def test_status_and_plan_highlight_usage_over_the_limit_on_a_terminal_only(
    tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    cfg = _over_the_limit(tmpfs, tmp_path)
    for cmd in ("status", "plan"):
        argv = [sys.executable, "-m", "diskguard", cmd, "-c", str(cfg)]
        out, rc = on_a_terminal(argv)
        assert rc in (0, 1), out
        assert BOLD_RED in out, (cmd, out)
        piped = _piped(argv)
        assert "\x1b[" not in piped.stdout, (cmd, piped.stdout)
    plan = _piped([sys.executable, "-m", "diskguard", "plan", "-c", str(cfg)]).stdout
    # The newest record of each planned segment, with its time zone.
    assert "2023-11-14 22:13:20 UTC" in plan, plan
    assert "segment(s)" not in plan


def test_status_and_audit_say_the_time_zone(tmpfs: Callable[[int], Path], tmp_path: Path) -> None:
    cfg = _over_the_limit(tmpfs, tmp_path)
    enforced = _piped([sys.executable, "-m", "diskguard", "enforce", "--once", "-c", str(cfg)])
    # Exit 1: still over the (absurd) limit once only the active segment is left.
    assert enforced.returncode in (0, 1), enforced.stdout + enforced.stderr
    audit = [json.loads(x) for x in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert any(x["phase"] == "done" for x in audit)
    for cmd in ("status", "audit"):
        out = _piped([sys.executable, "-m", "diskguard", cmd, "-c", str(cfg)]).stdout
        assert " UTC " in out or out.rstrip().endswith(" UTC"), (cmd, out)


def test_counts_read_as_a_person_writes_them(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[broker]\nlog_dirs = ["{log_dir}"]\n')
    out = _piped([sys.executable, "-m", "diskguard", "check-config", "-c", str(cfg)]).stdout
    assert f"ok (1 log dir: {log_dir})" in out, out
    line = status_cmd.reclaim_line(
        {
            "check_interval_s": 300,
            "delete_delay_s": 60,
            "settings_source": "x",
            "latency_samples": 1,
        }
    )
    assert "over 1 deletion" in line and "(s)" not in line, line
    assert plan_cmd.far_future_note([]) is None


def test_aggregate_says_at_once_that_spark_is_starting(tmp_path: Path) -> None:
    """On a terminal (stderr), before the JVM is up; nothing extra on a pipe."""
    leader, follower = pty.openpty()
    argv = [sys.executable, "-m", "diskguard", "aggregate"]
    argv += ["--input", str(tmp_path / "none"), "--output", str(tmp_path / "out")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, close_fds=True)
    os.close(follower)
    first = os.read(leader, 65536).decode()
    proc.kill()
    proc.wait(timeout=60)
    os.close(leader)
    assert "starting Spark (local[*])" in first, first
    piped = _piped(argv)
    assert "starting Spark" not in piped.stderr + piped.stdout


def test_over_the_limit_by_the_triggers_rule_on_exact_bytes() -> None:
    """The highlight follows the trigger (usage above the limit), not the rounded figure."""
    total = 10**9

    def fs(used: int) -> dict[str, object]:
        return {
            "mount": "/data",
            "device": "/dev/sdb1",
            "total_bytes": total,
            "used_bytes": used,
            "available_bytes": total - used,
            "usage_percent": round(100.0 * used / total, 3),
            "limit_percent": 70.0,
        }

    just_over = fs(700_000_004)  # 70.0000004 %: its usage_percent reads 70.0
    assert just_over["usage_percent"] == 70.0
    assert status_cmd.over_limit(just_over)
    assert not status_cmd.over_limit(fs(700_000_000))  # exactly at the limit: not over
    assert not status_cmd.over_limit(fs(699_999_000))


def test_plan_highlights_usage_just_over_the_limit_not_at_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from diskguard.retention.planner import FilesystemPlan, Plan

    monkeypatch.setenv("FORCE_COLOR", "1")
    total = 10**9
    for used, red in ((700_000_004, True), (700_000_000, False)):
        fs = FilesystemPlan(
            mount="/data",
            device="/dev/sdb1",
            log_dirs=("/data/kafka-logs",),
            total_bytes=total,
            used_bytes=used,
            available_bytes=total - used,
            usage_percent=round(100.0 * used / total, 3),
            limit_percent=70.0,
            target_percent=65.0,
            pending_reclaim_bytes=0,
            excess_bytes=0,
        )
        plan_cmd.render_plan(Plan((fs,), ()), "offline", "broker stopped", [])
        out = capsys.readouterr().out
        assert "70.00%" in out, out
        assert (BOLD_RED in out) is red, out
