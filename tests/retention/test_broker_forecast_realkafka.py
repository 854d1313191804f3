"""The broker-mode forecast beside a REAL Kafka broker: a one-off write is not a rate.

A real Apache Kafka broker (the newest 4.x unless the environment says otherwise) checks its
retention every 20 s. One-off writes leave the disk under its ceiling and nothing grows
after: ``diskguard run`` must delete nothing and hold no producer back. Measured before the
fix: right after the daemon's start a 30 MiB step was read over seconds as a rate ~10x what a
minute gives, the forecast ``used + r*L + r*P`` trimmed every closed segment and flow control
engaged on a prediction; a step a while later was read as 0.5 MiB/s for a minute and trimmed
again. The closed loop under steady writes: ``bench/bench_broker_reclaim.py``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import fsfixtures, kafka
from support.configs import write_config
from support.daemonproc import DaemonProc
from support.disks import df_percent, disk_capacity
from support.kafka.cluster import KafkaCluster, running_broker

MiB = 1024 * 1024
pytestmark = [pytest.mark.realkafka, pytest.mark.root]
TOPIC = "load"
PARTITIONS = 4
#: The broker's retention check period: the forecast's rate window is two periods and the
#: delete delay (``ReclaimModel.rate_window_s``), 40.5 s here, still longer than the 30 s a
#: rate needs after a start. Longer checks prove nothing more: the test waits out a window and
#: two checks, so each 10 s more costs it half a minute.
CHECK_INTERVAL_S = 20
DELETE_DELAY_S = 0.5
RATE_WINDOW_S = 2 * CHECK_INTERVAL_S + DELETE_DELAY_S


@pytest.fixture()
def broker(kafka_target: kafka.Target) -> Iterator[KafkaCluster]:
    """A broker of its own (20 s retention checks, 0.5 s delete delay) on a 256 MiB ext4."""
    settings = {
        "log.retention.check.interval.ms": str(CHECK_INTERVAL_S * 1000),
        "log.segment.delete.delay.ms": str(round(DELETE_DELAY_S * 1000)),
    }
    with (
        fsfixtures.loop_ext4(256 * MiB, 0, name="kafka-disk") as mount,
        running_broker(
            kafka_target.release,
            kafka_target.classpath,
            mount / "kafka-logs",
            mode=kafka_target.mode,
            settings=settings,
        ) as cluster,
    ):
        cluster.create_topic(TOPIC, PARTITIONS, **{"segment.bytes": str(MiB)})
        yield cluster


def write(broker: KafkaCluster, mib: int) -> None:
    """``mib`` MiB at full speed, all acknowledged."""
    errors = broker.produce(TOPIC, mib * 64, 16384, settings={"linger.ms": 20})
    assert not errors, errors[:3]


def first_segments(broker: KafkaCluster) -> list[bool]:
    return [(broker.log_dir / f"{TOPIC}-{p}" / f"{0:020d}.log").exists() for p in range(PARTITIONS)]


def test_one_off_writes_under_the_ceiling_delete_nothing(broker: KafkaCluster) -> None:
    write(broker, 60)  # old data: every closed segment of it could be trimmed
    mount = broker.log_dir.parent
    step = 100 * 30 * MiB / disk_capacity(mount)  # ~12 points of this disk
    # After both steps the disk stays 6 points under the ceiling, less than one step.
    ceiling = round(df_percent(mount) + 2 * step + 6, 1)
    tmp = Path(tempfile.mkdtemp(prefix="diskguard-forecast-"))
    cfg = write_config(
        tmp,
        broker.log_dir,
        broker={"bootstrap_servers": broker.bootstrap},
        flow_control={"overfull_percent": ceiling + 5, "underfull_percent": ceiling},
        assume_delete_policy=None,
        mode="broker",
        check_interval="5s",
        disk_usage_percent=ceiling,
        target_percent=ceiling - 5,
    )
    peak = 0.0
    with DaemonProc(cfg) as daemon:
        daemon.wait_for("daemon_started", timeout=60)
        began = time.monotonic()
        write(broker, 30)  # right after the start
        took = time.monotonic() - began
        # The forecast's rate is what every third of its window grew (RATE_WINDOW_S, or the
        # history since the start while shorter, from 30 s on): a quiet gap of two thirds of
        # the longest window holds a whole third however the thirds fall, so the steps are
        # told apart from a sustained write even when a loaded machine spreads each over
        # many seconds.
        time.sleep(max(30.0, 2 * RATE_WINDOW_S / 3))
        write(broker, 30)  # with the daemon running a while
        # past two retention checks and a rate window
        deadline = time.monotonic() + max(2 * CHECK_INTERVAL_S, RATE_WINDOW_S) + 4.5
        while time.monotonic() < deadline:
            peak = max(peak, df_percent(mount))
            time.sleep(0.2)
    names = [e.get("event") for e in daemon.events]
    assert peak < ceiling, (peak, ceiling)
    assert "delete_records" not in names and "segment_deleted" not in names, (
        f"first write took {took:.1f} s",
        [e for e in daemon.events if e.get("event") in ("overfull", "segment_deleted")][:2],
    )
    assert "overfull" not in names, [e for e in daemon.events if e.get("event") == "overfull"]
    assert all(first_segments(broker)), first_segments(broker)
