"""Nothing the daemon waits for may hold up flow control or its own exit.

A broker that hangs (SIGSTOP: connections accepted, nothing answered) used to hold the loop
for three client timeouts in a row within one retention cycle (consumer groups, metadata,
DeleteRecords): a disk crossing its overfull limit meanwhile was reported 13.5 s late, and
SIGTERM took 12 s. Now the cycle runs beside the loop and waits out one timeout at most.
A hook still running at SIGTERM used to outlive the daemon with its children; now its process
group goes with the daemon.

The bounds asserted are generous: each is below what a single broker timeout (5 s) would
cost, which is what the old loop could not avoid, and far above what the new one takes.
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
from support.disks import df_percent
from support.hung import MiB, cross_then_stop, grow

pytestmark = pytest.mark.root


@pytest.fixture()
def disk(loop_ext4: Callable[..., Path]) -> Path:
    return loop_ext4(96 * MiB)


def test_a_hung_broker_holds_up_neither_flow_control_nor_shutdown(
    disk: Path, tmp_path: Path
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
                "prefill_bytes": 8 * MiB,
            }
        },
        check_interval_ms=1000,
        initial_delay_ms=1000,
        delete_delay_ms=100,
        checkpoint_interval_ms=1000,
        write_rate=0,
    ) as broker:
        base = df_percent(disk)
        ceiling, overfull = round(base + 4, 2), round(base + 12, 2)
        config = write_config(
            tmp_path,
            log_dir,
            broker={"bootstrap_servers": broker.bootstrap},
            flow_control={"overfull_percent": overfull, "underfull_percent": ceiling},
            mode="broker",
            check_interval="1s",
            usage_poll_interval="0.1s",
            disk_usage_percent=ceiling,
        )
        try:
            with DaemonProc(config) as daemon:
                daemon.wait_for("daemon_started", timeout=60)
                os.kill(broker.pid, signal.SIGSTOP)
                cross_then_stop(
                    daemon, (disk / "over-ceiling", disk / "over-overfull"), ceiling, overfull
                )
        finally:
            os.kill(broker.pid, signal.SIGCONT)


HOOK = """#!/bin/sh
sleep 300 &
echo "$$ $!" > {pids}
exec sleep 300
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def test_a_hook_still_running_at_sigterm_goes_with_the_daemon(disk: Path, tmp_path: Path) -> None:
    log_dir = disk / "kafka"
    log_dir.mkdir()
    pids = tmp_path / "hook.pids"
    hook = tmp_path / "hook.sh"
    hook.write_text(HOOK.format(pids=pids))
    hook.chmod(0o755)
    base = df_percent(disk)
    overfull = round(base + 5, 2)
    config = write_config(
        tmp_path,
        log_dir,
        flow_control={
            "overfull_percent": overfull,
            "underfull_percent": round(base + 2, 2),
            "actuators": ["exec"],
            "on_change": [str(hook)],
            "on_change_timeout": "600s",
        },
        mode="dry-run",
        usage_poll_interval="0.1s",
    )
    with DaemonProc(config) as daemon:
        daemon.wait_for("daemon_started", timeout=60)
        grow(disk / "filler", overfull)
        daemon.wait_for("overfull", timeout=60)
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text().strip()):
            assert time.monotonic() < deadline, "the hook never started"
            time.sleep(0.05)
        hook_pid, child_pid = (int(p) for p in pids.read_text().split())
        assert _alive(hook_pid) and _alive(child_pid)
        assert daemon.stop() == 0
    deadline = time.monotonic() + 30
    while (_alive(hook_pid) or _alive(child_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(hook_pid), "the hook outlived the daemon"
    assert not _alive(child_pid), "the hook's child outlived the daemon"
