"""When the daemon may skip its periodic cycle (``Retention.quiet``), on a real log dir in
offline mode: only after a cycle that acted on nothing, with nothing it left under way, and
every filesystem well under its limits. Whether the log dirs changed is the hints' to say
(``test_watch``); when the loop skips, ``schedule`` (``test_schedule``)."""

from __future__ import annotations

import time
from pathlib import Path

from diskguard.config import load_config
from diskguard.daemon.brokerprobe import BrokerProbe
from diskguard.daemon.cycles import Retention
from diskguard.daemon.filesystems import Filesystems
from diskguard.metrics import Metrics
from diskguard.retention.planner import Deletion
from support import kafkagen
from support.configs import write_config


def _retention(tmp_path: Path, percent: float) -> tuple[Retention, Filesystems]:
    log_dir = tmp_path / "kafka"
    kafkagen.write_partition(log_dir, "orders", 0, [kafkagen.SegmentSpec()] * 3)
    config = load_config(
        write_config(tmp_path, log_dir, mode="offline", disk_usage_percent=percent)
    )
    probe = BrokerProbe(lambda: False, 1.0, lambda: None)
    return Retention(config, Metrics(), probe, lambda: None), Filesystems(config.broker.log_dirs)


def _cycle(retention: Retention) -> None:
    retention.start(full=False)
    deadline = time.monotonic() + 60
    while not retention.take():
        assert time.monotonic() < deadline, "the cycle did not finish within 60 s"
        time.sleep(0.05)


def test_quiet_only_after_a_cycle_and_while_well_under(tmp_path: Path) -> None:
    retention, filesystems = _retention(tmp_path, 99.9)
    usages = filesystems.usage()
    (usage,) = usages.values()
    assert not retention.quiet(usages, len(filesystems), 60.0)  # no cycle yet
    _cycle(retention)
    assert usage.usage_percent < 97.0, f"{usage.mount} too full for this test: {usage}"
    assert retention.quiet(usages, len(filesystems), 60.0)
    # A filesystem that could not be measured is never quiet.
    assert not retention.quiet({}, len(filesystems), 60.0)
    # DeleteRecords the broker has not carried out yet: the next cycle must see them go.
    (log_dir,) = retention.runtime.config.broker.log_dirs
    retention.runtime.requested.record(
        [Deletion(str(log_dir), "orders", 0, 0, 1, 0, 1, (), usage.mount)]
    )
    assert not retention.quiet(usages, len(filesystems), 60.0)


def test_never_quiet_near_the_ceiling(tmp_path: Path) -> None:
    (usage,) = Filesystems([tmp_path]).usage().values()
    # A ceiling half a point above today's usage: under it, but not well under.
    retention, filesystems = _retention(tmp_path / "b", round(usage.usage_percent + 0.5, 3))
    _cycle(retention)
    assert not retention.quiet(filesystems.usage(), len(filesystems), 60.0)
    retention.close()
