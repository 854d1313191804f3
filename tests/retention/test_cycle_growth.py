"""Offline cycles under a writer: the growth expected while a cycle runs is deleted too.

A cycle plans the excess it measured at its start; a writer keeps filling while it scans,
plans and unlinks. Without this, cycles under a steady writer ended part way back to the
ceiling (bench_reaction, 100k segments at 60 MiB/s: 69.45 % after the median cycle for a
69 % target) and the disk crossed again a few hundred ms later. On a loop ext4, as ``df``
sees it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from diskguard.config import load_config
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.planner import FilesystemPlan
from support.configs import write_config
from support.disks import df_percent, disk_capacity, over_ceiling
from support.fsfixtures import fill
from support.logdirs import build

MiB = 1024**2


def _goal_excess(fs: FilesystemPlan) -> int:
    """What plain KIP-61 asks of ``fs``: down to the target, nothing for growth."""
    usage = FilesystemUsage(fs.mount, fs.device, fs.total_bytes, fs.used_bytes, fs.available_bytes)
    return fs.used_bytes - fs.pending_reclaim_bytes - usage.used_bytes_at(fs.target_percent)


def test_offline_cycles_also_delete_what_the_disk_grows_while_they_run(
    disk: Path, tmp_path: Path
) -> None:
    log_dir, _truth = build(disk)
    limit = over_ceiling(disk, 2, digits=1)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
    with RetentionCycle(load_config(cfg)) as runtime:
        first = runtime.run(act=True)
        (fs1,) = first.plan.filesystems
        assert first.results and all(r.ok for r in first.results)
        # No write rate yet: plain KIP-61, and nothing predicted beyond today's usage.
        assert fs1.excess_bytes == _goal_excess(fs1)
        assert fs1.predicted_used_bytes == fs1.used_bytes
        assert runtime.cycle_growth(fs1.mount) is None
        assert len(runtime.offline_cycle_s) == 1
        took = runtime.offline_cycle_s[0]
        assert 0 < took <= first.duration_s

        # The daemon's usage polls saw a writer: ~1 MiB over one cycle's time.
        rate = float(MiB // took)
        runtime.observe_usage(fs1.mount, 0.0, fs1.used_bytes)
        runtime.observe_usage(fs1.mount, 10.0, fs1.used_bytes + int(10 * rate))
        growth = runtime.cycle_growth(fs1.mount)
        assert growth is not None
        assert growth[0] == rate and growth[1] == took
        expected_growth = int(rate * took)

        # Over the ceiling again, by half a MiB.
        back_over = (limit - df_percent(disk)) / 100 * disk_capacity(disk) + MiB // 2
        fill(disk / "more", int(back_over))
        second = runtime.run(act=True)
        (fs2,) = second.plan.filesystems
        assert fs2.excess_bytes == _goal_excess(fs2) + expected_growth
        assert fs2.predicted_used_bytes == fs2.used_bytes + expected_growth
        assert fs2.growth_bytes_per_s == rate
        assert fs2.chosen_bytes >= fs2.excess_bytes and fs2.reachable
        assert second.results and all(r.ok for r in second.results)
        # Here nothing wrote meanwhile: the disk ends under the target by about that growth,
        # the most this rule deletes beyond plain KIP-61 (segments are whole, so a little more).
        assert df_percent(disk) <= fs2.target_percent - 100 * expected_growth / fs2.total_bytes


def test_the_expected_cycle_time_is_the_middle_of_recent_cycles_at_most_check_interval(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    cfg = write_config(tmp_path, [log_dir], mode="offline", check_interval="2s")
    with RetentionCycle(load_config(cfg)) as runtime:
        runtime.observe_usage("/m", 0.0, 0)
        runtime.observe_usage("/m", 4.0, 40 * MiB)
        assert runtime.cycle_growth("/m") is None  # a rate, but no acting cycle yet
        runtime.offline_cycle_s.extend([0.2, 1.9, 0.3])  # the first, cold cycle was slow
        assert runtime.cycle_growth("/m") == (10 * MiB, 0.3)
        runtime.offline_cycle_s.extend([30.0, 30.0, 30.0])
        assert runtime.cycle_growth("/m") == (10 * MiB, 2.0)
        assert runtime.cycle_growth("/elsewhere") is None  # no rate there
        # Only offline mode sizes its excess by it (broker mode has its own forecast).
        assert runtime.inputs.limits_of("offline", "/m").cycle_growth_bytes == 20 * MiB
        assert runtime.inputs.limits_of("broker", "/m").cycle_growth_bytes == 0
        assert runtime.inputs.limits_of("dry-run", "/m").cycle_growth_bytes == 0


def test_a_cycle_whose_deletions_all_failed_does_not_count(disk: Path, tmp_path: Path) -> None:
    log_dir, _truth = build(disk)
    limit = over_ceiling(disk, 2, digits=1)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
    with RetentionCycle(load_config(cfg)) as runtime:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True, timeout=30)
        try:
            outcome = runtime.run(act=True)
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True, timeout=30)
        assert outcome.results and not any(r.ok for r in outcome.results)
        assert not runtime.offline_cycle_s
