"""``diskguard run`` beside a broker that hangs (SIGSTOP): what the stand-in's test
(tests/daemon/test_shutdown.py) and the real broker's (tests/broker/test_realkafka_hung.py)
both assert, with bounds generous enough not to flake: each is below what one broker timeout
costs, which the loop could not avoid while it waited on the broker itself."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from support.daemonproc import DaemonProc
from support.disks import df_percent, disk_capacity
from support.fsfixtures import fill

#: The broker client's timeout (``RetentionCycle``): what one unanswered request costs.
BROKER_TIMEOUT_S = 5.0
MiB = 1024 * 1024


def grow(path: Path, past: float) -> None:
    """Write the filler ``path`` bringing df's usage of its filesystem just past ``past``."""
    mount = path.parent
    need = int((past + 0.5 - df_percent(mount)) / 100 * disk_capacity(mount))
    fill(path, max(need, MiB))
    os.sync()


def cross_then_stop(
    daemon: DaemonProc, fillers: tuple[Path, Path], ceiling: float, overfull: float
) -> None:
    """The broker already hung: over the retention ceiling (a cycle asks the broker and
    waits), then over the overfull limit meanwhile: ``overfull`` must come within the usage
    poll; then SIGTERM while that cycle still waits: out before the broker would answer, the
    cycle abandoned; and no cycle waited out more than one timeout."""
    grow(fillers[0], ceiling)
    time.sleep(1.0)
    grow(fillers[1], overfull)
    crossed = time.monotonic()
    event = daemon.wait_for("overfull", timeout=30)
    late = event["_t"] - crossed
    print(f"overfull reported {late:.2f} s after the crossing")
    assert late < BROKER_TIMEOUT_S - 2, late
    time.sleep(0.5)
    stopped_at = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    code = daemon.proc.wait(timeout=60)
    took = time.monotonic() - stopped_at
    print(f"SIGTERM to exit: {took:.2f} s")
    assert code == 0
    assert took < BROKER_TIMEOUT_S - 1, took
    stopped = daemon.wait_for("daemon_stopped", timeout=5)
    assert stopped.get("cycle_under_way") is True, stopped
    # One timeout per cycle, not one per broker request (a hung broker cost three).
    for cycle in daemon.named("retention_cycle"):
        assert cycle["duration_ms"] < 2 * (BROKER_TIMEOUT_S + 2) * 1000, cycle
