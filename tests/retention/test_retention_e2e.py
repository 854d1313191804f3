"""KIP-61 end to end on a real loop-mounted ext4 with real Kafka-format log dirs.

``plan`` must name exactly the global-oldest prefix, ``enforce --once`` (offline) must bring df
under the limit deleting exactly those segments, and a log dir whose ``.lock`` another
process holds must never be touched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from support.cli import json_events, run_cli
from support.configs import write_config
from support.disks import df_percent, disk_free, over_ceiling
from support.fsfixtures import fill
from support.kafkagen import hold_lock
from support.logdirs import build, expected_order

MiB = 1024**2


def test_plan_then_enforce_offline_deletes_exactly_the_global_oldest_prefix(
    disk: Path, tmp_path: Path
) -> None:
    log_dir, truth = build(disk)
    fill(disk / "filler", int((disk_free(disk)) * 0.6))
    usage = df_percent(disk)
    limit = round(usage - 4, 1)
    cfg = write_config(
        tmp_path, log_dir, disk_usage_percent=limit, mode="offline", offline_headroom=0
    )

    proc = run_cli("plan", "-c", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    fs = plan["filesystems"][0]
    assert fs["mount"] == str(disk) and fs["limit_percent"] == limit
    assert abs(fs["usage_percent"] - usage) < 0.5
    chosen = [(d["topic"], d["partition"], d["base_offset"]) for d in plan["deletions"]]
    order = expected_order(truth)
    assert chosen == order[: len(chosen)], "not the global-oldest prefix"
    assert all(
        d["max_timestamp_ms"] == truth[k][0] for d, k in zip(plan["deletions"], chosen, strict=True)
    )
    covered = sum(d["bytes"] for d in plan["deletions"])
    assert covered >= fs["excess_bytes"] > covered - plan["deletions"][-1]["bytes"], "not minimal"

    before = {str(p) for p in log_dir.rglob("*") if p.is_file()}
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert df_percent(disk) <= limit
    after = {str(p) for p in log_dir.rglob("*") if p.is_file()}
    gone = before - after
    expected_gone = {str(f) for k in chosen for f in truth[k][1]}
    assert gone == expected_gone & before
    events = json_events(proc.stdout)
    deleted = [e for e in events if e["event"] == "segment_deleted"]
    assert [(e["topic"], e["partition"], e["base_offset"]) for e in deleted] == chosen
    assert any(e["event"] == "retention_cycle" for e in events)
    audit = (tmp_path / "state" / "audit.jsonl").read_text().splitlines()
    assert len(audit) >= 2 * len(chosen)


def test_locked_log_dir_is_never_touched(disk: Path, tmp_path: Path) -> None:
    log_dir, _truth = build(disk)
    limit = over_ceiling(disk, 4, digits=1)
    cfg = write_config(tmp_path, log_dir, disk_usage_percent=limit, mode="offline")
    snapshot = {str(p): os.stat(p).st_ino for p in log_dir.rglob("*")}
    with hold_lock(log_dir):
        proc = run_cli("enforce", "--once", "-c", str(cfg))
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "refused" in proc.stderr
        cfg_auto = write_config(tmp_path, log_dir, disk_usage_percent=limit, mode="auto")
        proc = run_cli("enforce", "--once", "-c", str(cfg_auto))
        assert proc.returncode == 3, proc.stdout + proc.stderr
    assert {str(p): os.stat(p).st_ino for p in log_dir.rglob("*")} == snapshot


def test_under_limit_exit_0_and_dry_run_deletes_nothing(disk: Path, tmp_path: Path) -> None:
    log_dir, _ = build(disk)
    cfg = write_config(tmp_path, log_dir, disk_usage_percent=99.0)
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    limit = over_ceiling(disk, 4, digits=1)
    cfg = write_config(tmp_path, log_dir, disk_usage_percent=limit, mode="dry-run")
    before = sorted(str(p) for p in log_dir.rglob("*"))
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode == 1
    assert sorted(str(p) for p in log_dir.rglob("*")) == before
    proc = run_cli("plan", "-c", str(cfg))
    assert proc.returncode == 0 and "Would delete" in proc.stdout
