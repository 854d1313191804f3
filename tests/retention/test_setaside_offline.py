"""Offline, a segment file that refuses removal (``chattr +i``: EPERM even for root) on real
loop-mounted ext4: the partition is set aside and the next cycle frees the space from the
other partitions, instead of choosing the same segments first every cycle and staying over
the limit (measured before this: 62.8 % under a 61.5 % limit, every cycle)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from diskguard.config import load_config
from diskguard.daemon.schedule import STATE_EVERY_S
from diskguard.retention.audit import AuditLog
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.offline.journal import Journal
from support import disks
from support.cli import json_events, run_cli
from support.configs import write_config
from support.daemonproc import DaemonProc
from support.fsfixtures import loop_ext4
from support.logdirs import build, expected_order
from support.net import free_port

MiB = 1024**2


@contextlib.contextmanager
def oldest_immutable(suffix: str) -> Iterator[tuple[Path, list[tuple[str, int, int]], float]]:
    """A log dir over its limit whose globally oldest segment's ``suffix`` file is immutable."""
    with loop_ext4(64 * MiB) as mount:
        log_dir, truth = build(mount)
        order = expected_order(truth)
        topic, partition, base = order[0]
        victim = log_dir / f"{topic}-{partition}" / f"{base:020d}{suffix}"
        subprocess.run(["chattr", "+i", str(victim)], check=True)
        try:
            yield log_dir, order, disks.over_ceiling(mount, 4, digits=1)
        finally:
            subprocess.run(["chattr", "-i", str(victim)], check=True)


@pytest.fixture()
def immutable_oldest() -> Iterator[tuple[Path, list[tuple[str, int, int]], float]]:
    with oldest_immutable(".log") as setup:
        yield setup


def test_a_segment_that_refuses_removal_sets_its_partition_aside(
    immutable_oldest: tuple[Path, list[tuple[str, int, int]], float], tmp_path: Path
) -> None:
    log_dir, order, limit = immutable_oldest
    config = load_config(write_config(tmp_path, log_dir, disk_usage_percent=limit, mode="offline"))
    stuck = order[0][:2]
    pdir = log_dir / f"{stuck[0]}-{stuck[1]}"
    before = sorted(p.name for p in pdir.iterdir())
    with RetentionCycle(config) as cycle, capture_logs() as logs:
        first = cycle.enforce()
        failed = [r for r in first.results if not r.ok]
        assert failed and {(r.deletion.topic, r.deletion.partition) for r in failed} == {stuck}
        assert "Operation not permitted" in (failed[0].error or "") and failed[0].lasting
        (aside,) = [e for e in logs if e["event"] == "partition_set_aside"]
        assert (aside["topic"], aside["partition"]) == stuck

        # Whatever the first cycle left over the limit, the next one frees from the others.
        second = cycle.enforce()
        assert stuck not in {(d.topic, d.partition) for d in second.plan.deletions}
        assert all(r.ok for r in second.results)
        assert second.exit_code() == 0, [f.mount for f in second.plan.filesystems]
        reason = {t.topic: t.reason for t in second.plan.protected}[stuck[0]]
        assert "set aside" in reason and "Operation not permitted" in reason
    # Nothing of that partition went: no hole behind the segment that refused.
    assert sorted(p.name for p in pdir.iterdir()) == before


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_a_segment_whose_index_refuses_removal_is_left_whole(suffix: str, tmp_path: Path) -> None:
    """The ``.log`` is renamed first, then the index fails (``EPERM``): the ``.log`` is
    renamed back, so the segment stays whole. Left half-removed, Kafka's log loading would
    try to delete the orphaned index it cannot remove and the broker would not start
    (``test_realkafka_rescue``). Nothing is left open for recovery; the partition is set
    aside and the next cycle frees the space from the others."""
    with oldest_immutable(suffix) as (log_dir, order, limit):
        state = tmp_path / "state"
        cfg = write_config(tmp_path, log_dir, disk_usage_percent=limit, mode="offline")
        topic, partition, base = order[0]
        pdir = log_dir / f"{topic}-{partition}"
        before = {p.name: p.stat().st_ino for p in pdir.iterdir()}
        with RetentionCycle(load_config(cfg)) as cycle:
            first = cycle.enforce()
            failed = [r for r in first.results if not r.ok]
            assert [(r.deletion.partition, r.deletion.base_offset) for r in failed][:1] == [
                (partition, base)
            ]
            victim = pdir / f"{base:020d}{suffix}"
            assert failed[0].lasting and f"Operation not permitted ({victim})" in str(
                failed[0].error
            )
            # The same files under the same names: the .log renamed back, not copied.
            assert {p.name: p.stat().st_ino for p in pdir.iterdir()} == before
            assert Journal(state, AuditLog(state / "audit.jsonl")).open_entries() == []
            second = cycle.enforce()
            assert second.results and all(r.ok for r in second.results)
            assert second.exit_code() == 0
        assert {p.name: p.stat().st_ino for p in pdir.iterdir()} == before


def test_enforce_once_gets_under_the_limit_from_the_other_partitions(
    immutable_oldest: tuple[Path, list[tuple[str, int, int]], float], tmp_path: Path
) -> None:
    """``enforce --once`` (from cron: no daemon memory) sets the partition aside and plans
    again within the run: the disk ends under its limit. Exit 1 still: a deletion failed."""
    log_dir, order, limit = immutable_oldest
    cfg = write_config(tmp_path, log_dir, disk_usage_percent=limit, mode="offline")
    stuck = order[0][:2]
    proc = run_cli("enforce", "--once", "--json", "-c", str(cfg))
    assert proc.returncode == 1, proc.stderr
    events = json_events(proc.stdout)
    cycles = [e for e in events if e["event"] == "retention_cycle"]
    assert len(cycles) == 2, cycles
    assert cycles[-1]["usage_after"] <= limit, cycles
    (aside,) = [e for e in events if e["event"] == "partition_set_aside"]
    assert (aside["topic"], aside["partition"]) == stuck
    deleted = [(e["topic"], e["partition"]) for e in events if e["event"] == "segment_deleted"]
    assert deleted and stuck not in deleted
    assert "over its" not in proc.stderr, proc.stderr


def test_plan_and_status_show_what_the_running_daemon_set_aside(
    immutable_oldest: tuple[Path, list[tuple[str, int, int]], float], tmp_path: Path
) -> None:
    """The daemon's memory is in ``state.json``: a ``plan`` run beside it protects the
    partition with the daemon's reason instead of choosing the segment the daemon knows it
    cannot delete, and ``status`` lists it."""
    log_dir, order, limit = immutable_oldest
    topic, partition = order[0][:2]
    port = free_port()
    config = write_config(
        tmp_path,
        log_dir,
        disk_usage_percent=limit,
        mode="offline",
        check_interval="1s",
        metrics={"listen": f"127.0.0.1:{port}"},
    )
    with DaemonProc(config) as daemon:
        daemon.wait_for("partition_set_aside", timeout=60, topic=topic, partition=partition)
        daemon.wait_for("daemon_started", timeout=30)
        time.sleep(STATE_EVERY_S + 1)  # state.json rewritten since
        plan = json.loads(run_cli("plan", "--json", "-c", str(config)).stdout)
        reason = {t["topic"]: t["reason"] for t in plan["protected"]}.get(topic, "")
        victim = log_dir / f"{topic}-{partition}" / f"{order[0][2]:020d}.log"
        assert reason.startswith("set aside:"), plan["protected"]
        assert f"Operation not permitted ({victim})" in reason  # the path: which partition
        assert (topic, partition) not in {(d["topic"], d["partition"]) for d in plan["deletions"]}
        status = json.loads(run_cli("status", "--json", "-c", str(config)).stdout)
        (entry,) = status["set_aside"]
        assert (entry["topic"], entry["partition"]) == (topic, partition)
        assert 0 < entry["until"] - time.time() <= 300
        text = run_cli("status", "-c", str(config), env={"COLUMNS": "300"}).stdout
        assert f"{topic}-{partition}: set aside (kept, not deleted) until" in text
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b"\ndiskguard_partitions_set_aside 1.0\n" in scraped
        assert daemon.stop() == 0
    # No daemon any more: plan chooses the oldest segment again (it has no memory of its own).
    plan = json.loads(run_cli("plan", "--json", "-c", str(config)).stdout)
    assert not any("set aside" in t["reason"] for t in plan["protected"])
