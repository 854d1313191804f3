"""Broker mode, closed loop: ``diskguard run`` beside the stand-in broker on a real ext4.

The stand-in (tests/support/standin) behaves like Kafka's log manager as measured on Kafka 2.2: it
holds ``.lock``, keeps its segment files open, DeleteRecords moves the log start offset at
once, and a retention check at a fixed rate renames the segments ``*.deleted`` and unlinks
them a delete delay later. So space asked for is freed only seconds later, as with a real
broker, and the ceiling holds only if diskguard asks ahead (README, "Holding the ceiling in
broker mode"). The same loop against a real Kafka broker: bench/bench_broker_reclaim.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support import standin
from support.cli import run_cli
from support.configs import write_config
from support.daemonproc import DaemonProc
from support.disks import df_percent

MiB = 1024 * 1024
pytestmark = pytest.mark.root


@pytest.fixture()
def disk(loop_ext4: Callable[..., Path]) -> Path:
    return loop_ext4(160 * MiB)


def _config(
    tmp: Path,
    log_dir: Path,
    bootstrap: str,
    flow_control: dict[str, object] | None = None,
    **retention: Any,
) -> Path:
    return write_config(
        tmp,
        log_dir,
        broker={"bootstrap_servers": bootstrap},
        flow_control=flow_control,
        assume_delete_policy=None,
        mode="broker",
        check_interval="1s",
        **retention,
    )


@pytest.fixture()
def broker(disk: Path, tmp_path: Path) -> Iterator[standin.Standin]:
    log_dir = disk / "kafka"
    log_dir.mkdir()
    with standin.start(
        tmp_path / "standin",
        log_dirs=[log_dir],
        topics={
            "load": {
                "partitions": 4,
                "configs": {"segment.bytes": str(512 * 1024)},
                "prefill_bytes": 18 * MiB,  # ~45 % of the disk before it serves
            }
        },
        check_interval_ms=2000,
        initial_delay_ms=2000,
        delete_delay_ms=300,
        checkpoint_interval_ms=1000,
        write_rate=0,
    ) as handle:
        yield handle


def _sample_until(mount: Path, seconds: float) -> list[tuple[float, float]]:
    out = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        out.append((time.monotonic() - start, df_percent(mount)))
        time.sleep(0.1)
    return out


def test_the_ceiling_holds_while_the_broker_frees_space_only_at_its_retention_checks(
    disk: Path, broker: standin.Standin, tmp_path: Path
) -> None:
    log_dir = disk / "kafka"
    cfg = _config(tmp_path, log_dir, broker.bootstrap, disk_usage_percent=70, target_percent=60)
    broker.set_rate(1.5 * MiB)
    with DaemonProc(cfg) as daemon:
        daemon.wait_for("daemon_started", timeout=30)
        # Fill to just under the ceiling, then watch ~10 retention checks.
        deadline = time.monotonic() + 120
        while df_percent(disk) < 55 and time.monotonic() < deadline:
            time.sleep(0.2)
        samples = _sample_until(disk, 25)
        status = json.loads(run_cli("status", "--json", "-c", str(cfg), check=True).stdout)
        plan = json.loads(run_cli("plan", "--json", "-c", str(cfg), check=True).stdout)
        broker.pause()
    peak = max(p for _t, p in samples)
    over = sum(0.1 for _t, p in samples if p > 70.0)
    asked = daemon.named("delete_records")
    assert asked, daemon.stderr_tail()
    # Asked ahead: usage never went (more than a point) over the ceiling. No timing claim
    # beyond that: the machine may be busy; the benchmark has the figures.
    assert peak <= 71.0, (peak, over)
    assert over <= 2.0, (peak, over)
    # It did not keep the disk needlessly empty: with a 2 s check at 1.5 MiB/s the sawtooth
    # spans ~2 points, so once settled usage stays near the goal (target 60).
    settled = [p for t, p in samples if t > 10]
    assert min(settled) >= 55.0, min(settled)

    fs = status["filesystems"][0]
    reclaim = fs["reclaim"]
    # Learned from the broker (DescribeConfigs), and measured from our own deletions.
    assert reclaim["check_interval_s"] == 2.0 and reclaim["delete_delay_s"] == 0.3
    assert reclaim["settings_source"] == "broker"
    assert reclaim["latency_samples"] > 0
    assert 0.3 <= reclaim["latency_p50_s"] <= reclaim["latency_max_s"] <= 2.3 + 1.5
    assert reclaim["latency_source"] == "measured"
    assert reclaim["growth_bytes_per_s"] > 0.5 * MiB
    # plan (one-shot) takes the running daemon's rate and shows what the rule rests on.
    pfs = plan["filesystems"][0]
    assert plan["mode"] == "broker"
    assert pfs["growth_bytes_per_s"] > 0.5 * MiB
    assert pfs["reclaim_period_s"] == 2.0
    assert pfs["forecast_horizon_s"] is None  # a daemon's rate, sustained through its window
    assert pfs["latency_source"] in ("settings", "measured")
    assert plan["scope"].startswith("broker mode trims cluster-wide")


def test_flow_control_engages_on_the_predicted_usage_and_says_so(
    disk: Path, tmp_path: Path
) -> None:
    """Nothing deletable (a compacted topic): the usage predicted for the broker's reclaim
    reaches the overfull limit before the usage does, and producers are held back then. The
    broker checks every 10 s: at 1 MiB/s that needs ~10 MiB above the ceiling (95 % of a
    160 MiB disk leaves 8), so ``broker_reclaim_slow`` names the settings to lower. The disk
    starts low enough that the writes are sustained through the window a forecast needs
    (two checks and the delete delay, 20.3 s) before the prediction crosses."""
    log_dir = disk / "kafka"
    log_dir.mkdir()
    with standin.start(
        tmp_path / "standin",
        log_dirs=[log_dir],
        topics={
            "state": {
                "partitions": 2,
                "configs": {"segment.bytes": str(512 * 1024), "cleanup.policy": "compact"},
                "prefill_bytes": 14 * MiB,
            }
        },
        check_interval_ms=10_000,
        initial_delay_ms=10_000,
        delete_delay_ms=300,
        write_rate=0,
    ) as broker:
        cfg = _config(
            tmp_path,
            log_dir,
            broker.bootstrap,
            flow_control={"overfull_percent": 60, "underfull_percent": 50},
            disk_usage_percent=95,
        )
        with DaemonProc(cfg) as daemon:
            daemon.wait_for("daemon_started", timeout=30)
            broker.set_rate(1 * MiB)
            slow = daemon.wait_for("broker_reclaim_slow", timeout=60)
            event = daemon.wait_for("overfull", timeout=90)
            usage_then = df_percent(disk)
            broker.pause()
    assert event["reason"] == "predicted", event
    # Overfull engages at usage >= overfull_percent, so a prediction of exactly 60 % (or one
    # that rounds to it) is a crossing too.
    assert event["usage_percent"] < 60.0 <= event["predicted_usage_percent"], event
    assert usage_then < 60.0
    assert slow["headroom_needed_bytes"] > slow["headroom_bytes"], slow
    assert slow["reclaim_latency_s"] == pytest.approx(10.3)
    assert "log.retention.check.interval.ms=10000" in slow["change"], slow
