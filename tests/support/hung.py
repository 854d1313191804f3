"""``diskguard run`` beside a broker that hangs (SIGSTOP): what the stand-in's test
(tests/daemon/test_shutdown.py) and the real broker's (tests/broker/test_realkafka_hung.py)
both assert. Without a clock: a hung broker makes a cycle wait out one client timeout
(``BROKER_TIMEOUT_S``), and what must not wait for it -- the overfull report, the exit --
is shown to have happened while that cycle still waited (the events' order, and the cycle
``daemon_stopped`` says was still under way). How long each took is printed for the log."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from support.daemonproc import DaemonProc
from support.disks import df_percent, disk_capacity

#: The broker client's timeout (``RetentionCycle``): what one unanswered request costs.
BROKER_TIMEOUT_S = 5.0
MiB = 1024 * 1024
#: Events only a cycle that finished (its broker calls answered or timed out) logs.
_CYCLE_OVER = ("retention_cycle", "broker_unreachable", "delete_records", "segment_delete_failed")


def grow(path: Path, past: float) -> None:
    """Allocate the filler ``path``, bringing df's usage of its filesystem just past ``past``.

    ``fallocate``: the blocks count at once, with no data to write back. Written and synced
    instead, the growth waited on a loaded machine's writeback for seconds, which came out
    of the one broker timeout within which the test must cross both limits and stop."""
    mount = path.parent
    need = int((past + 0.5 - df_percent(mount)) / 100 * disk_capacity(mount))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, max(need, MiB))
    finally:
        os.close(fd)


def cross_then_stop(
    daemon: DaemonProc, fillers: tuple[Path, Path], ceiling: float, overfull: float
) -> None:
    """The broker already hung: over the retention ceiling (a cycle asks the broker and
    waits), then over the overfull limit meanwhile: ``overfull`` must be reported before
    that cycle is over; then SIGTERM while that cycle still waits: the daemon exits 0 and
    says the cycle was abandoned; and no cycle waited out more than one timeout."""
    mark = len(daemon.events)
    grow(fillers[0], ceiling)
    time.sleep(1.0)
    grow(fillers[1], overfull)
    crossed = time.monotonic()
    event = daemon.wait_for("overfull", timeout=60)
    print(f"overfull reported {event['_t'] - crossed:.2f} s after the crossing")
    meanwhile = daemon.events[mark : daemon.events.index(event)]
    assert not [e for e in meanwhile if e.get("event") in _CYCLE_OVER], meanwhile
    time.sleep(0.5)
    stopped_at = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    code = daemon.proc.wait(timeout=60)
    print(f"SIGTERM to exit: {time.monotonic() - stopped_at:.2f} s")
    assert code == 0
    stopped = daemon.wait_for("daemon_stopped", timeout=60)
    # Out while the cycle still waited on the broker: the exit did not wait for it.
    assert stopped.get("cycle_under_way") is True, stopped
    # One timeout per cycle, not one per broker request (a hung broker cost three).
    for cycle in daemon.named("retention_cycle"):
        assert cycle["duration_ms"] < 2 * (BROKER_TIMEOUT_S + 2) * 1000, cycle
