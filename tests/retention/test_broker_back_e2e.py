"""Stuck for want of the broker, then it answers again: the probe notices, the broker is asked.

``diskguard run`` (auto) beside the stand-in broker on a real ext4 over its ceiling. The
broker is stopped with SIGSTOP: it still holds ``.lock`` but answers nothing, so retention is
refused (no unlinking under a live broker, no DeleteRecords without one), or, when the topics'
cleanup policies are known only to the broker, every topic is kept; the daemon is stuck and
backs its rescans off. SIGCONT brings it back. Before the background probe the daemon
noticed only at its next rescan, up to a minute later with the disk still over; now the
probe's answer wakes the loop (``broker_reachable_again``) and the cycle asks the broker.

While the probe runs, a cycle takes its answer rather than ask the broker, so the probe is
the daemon's only way to learn that the broker is back: the broker asked at all after
``broker_reachable_again`` shows the probe at work. That its answer ends the backed-off
skipping at once is held without a clock in ``tests/daemon/test_quiet.py``; the time from
SIGCONT to DeleteRecords is printed for the log, never asserted (on two loaded cores it is
seconds of scheduling, not the daemon's).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from support import standin
from support.configs import write_config
from support.daemonproc import DaemonProc
from support.disks import over_ceiling

MiB = 1024 * 1024
pytestmark = pytest.mark.root
#: Stuck this long before the broker comes back: the rescan back-off (1, 2, 4, 8, 16 s...)
#: has grown well past the probe interval by then.
STUCK_S = 16.0
#: How long any one step may take on a loaded machine before the test fails as broken.
WAIT_S = 60.0


@pytest.fixture()
def disk(loop_ext4: Callable[..., Path]) -> Path:
    return loop_ext4(96 * MiB)


@pytest.mark.parametrize(
    ("policies", "reason", "detail"),
    [
        # Every topic deletable by config: only the mode stops it (.lock held, no broker).
        ([".*"], "refused", "not reachable"),
        # The topics' cleanup policies come from the broker: unknown, so all are kept.
        (None, "target_unreachable", "protected"),
    ],
    ids=["refused", "policies-unknown"],
)
def test_a_broker_answering_again_ends_the_stuck_state_without_waiting_for_the_back_off(
    disk: Path, tmp_path: Path, policies: list[str] | None, reason: str, detail: str
) -> None:
    log_dir = disk / "kafka"
    log_dir.mkdir()
    with standin.start(
        tmp_path / "standin",
        log_dirs=[log_dir],
        topics={
            "load": {
                "partitions": 2,
                "configs": {"segment.bytes": str(512 * 1024)},
                "prefill_bytes": 6 * MiB,
            }
        },
        check_interval_ms=1000,
        initial_delay_ms=1000,
        delete_delay_ms=100,
        checkpoint_interval_ms=1000,
        write_rate=0,
    ) as broker:
        limit = over_ceiling(disk, cushion=1.0, share=0.5)
        config = write_config(
            tmp_path,
            log_dir,
            broker={"bootstrap_servers": broker.bootstrap},
            assume_delete_policy=policies,
            mode="auto",
            check_interval="1s",
            disk_usage_percent=limit,
        )
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            with DaemonProc(config) as daemon:
                daemon.wait_for("daemon_started", timeout=WAIT_S)
                stuck = daemon.wait_for("retention_stuck", timeout=WAIT_S, reason=reason)
                assert detail in stuck["detail"], stuck
                # A reload rebuilds the broker client under the running probe.
                daemon.proc.send_signal(signal.SIGHUP)
                daemon.wait_for("config_reloaded", timeout=WAIT_S)
                time.sleep(STUCK_S)
                assert not daemon.named("delete_records")
                assert not daemon.named("segment_deleted")  # never unlinked under the broker
                os.kill(broker.pid, signal.SIGCONT)
                back = time.monotonic()
                answered = daemon.wait_for("broker_reachable_again", timeout=WAIT_S)
                asked = daemon.wait_for("delete_records", timeout=WAIT_S)
                print(f"broker asked {asked['_t'] - back:.2f} s after SIGCONT")
                assert daemon.events.index(answered) < daemon.events.index(asked)
                assert asked["topic"] == "load"
                daemon.wait_for("retention_stuck_cleared", timeout=WAIT_S, reason=reason)
                assert daemon.stop() == 0
                # From the broker's return on, only what it deleted itself (DeleteRecords: the
                # same cycle logs them as segment_deleted, mode broker, after the clear).
                deleted = daemon.named("segment_deleted")
                assert all(e["mode"] == "broker" for e in deleted), deleted
        finally:
            os.kill(broker.pid, signal.SIGCONT)
