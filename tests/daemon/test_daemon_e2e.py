"""The daemon end to end on a real loop ext4: retention, flow control, hook, snapshots,
metrics, sd_notify, SIGHUP reload and SIGTERM — one daemon process, one scenario.

Every wait here is for a condition (an event, a file, a count), with a bound only so that a
broken daemon fails instead of hanging: on two loaded cores a reaction can take seconds. The
reaction-time figures come from ``bench/bench_reaction.py``; the one measured here is only
printed for the log.
"""

from __future__ import annotations

import signal
import socket
import time
import urllib.request
from pathlib import Path

from support.configs import write_config
from support.daemonproc import DaemonProc
from support.disks import df_percent, fill_to
from support.logdirs import build, expected_order
from support.net import free_port
from support.spool import spooled

MiB = 1024**2
#: How long any one step may take before the test fails as broken rather than slow.
WAIT_S = 60.0


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.path = path
        self.messages: list[str] = []

    def drain(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                return self.messages


def test_daemon_guards_a_real_disk(disk: Path, tmp_path: Path) -> None:
    log_dir, truth = build(disk)
    base = df_percent(disk)
    ceiling, target = round(base + 4, 2), round(base + 3, 2)
    overfull, underfull = round(base + 3.5, 2), round(base + 1.5, 2)
    hook_log = tmp_path / "hook.log"
    hook = tmp_path / "hook.sh"
    hook.write_text(
        "#!/bin/sh\n"
        f'env | grep ^DISKGUARD_ | sort | tr "\\n" " " >> {hook_log}\n'
        f"echo >> {hook_log}\n"
    )
    hook.chmod(0o755)
    port = free_port()
    state = tmp_path / "state"
    config = write_config(
        tmp_path,
        log_dir,
        flow_control={
            "overfull_percent": overfull,
            "underfull_percent": underfull,
            "min_free_bytes": "1MiB",
            "actuators": ["exec"],
            "on_change": [hook],
        },
        alerts={"low_space_percent": round(base + 1, 2)},
        snapshots={"interval": "2s", "host": "test-host"},
        metrics={"listen": f"127.0.0.1:{port}"},
        state_dir=state,
        disk_usage_percent=ceiling,
        target_percent=target,
        check_interval="2s",
        mode="offline",
        offline_headroom=0,
    )
    good = config.read_text()
    notify = NotifySocket(tmp_path / "notify.sock")
    with DaemonProc(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
        daemon.wait_for("daemon_started")
        deadline = time.monotonic() + WAIT_S
        while "READY=1" not in "".join(notify.drain()) and time.monotonic() < deadline:
            pass
        assert any("READY=1" in m for m in notify.messages), notify.messages

        # Between the limits: no overfull, no deletion.
        fill_to(disk, "filler-a", base + 2.5)
        time.sleep(1.0)
        assert not daemon.named("overfull") and not daemon.named("segment_deleted")

        # Over the ceiling: overfull, and a cycle brings it back under the ceiling. A cycle
        # may start while filler-b is still being written (the usage poll sees the crossing
        # mid-write) and leave it over: the one awaited is the cycle that brought it under.
        crossed = time.monotonic()
        fill_to(disk, "filler-b", base + 5)
        event = daemon.wait_for("overfull", timeout=WAIT_S)
        assert event["message"] == "store overfull, flow control will be enforced"
        cycle = daemon.wait_for(
            "retention_cycle",
            timeout=WAIT_S,
            where=lambda e: e["usage_after"] is not None and e["usage_after"] <= ceiling,
        )
        print(f"back under the ceiling {cycle['_t'] - crossed:.3f}s after the crossing")
        assert cycle["usage_before"] > ceiling >= cycle["usage_after"]
        assert df_percent(disk) <= ceiling
        deleted = [
            (e["topic"], e["partition"], e["base_offset"]) for e in daemon.named("segment_deleted")
        ]
        assert deleted and deleted == expected_order(truth)[: len(deleted)]

        # Usage now near target, between underfull and overfull: still overfull, no clear.
        time.sleep(1.0)
        assert len(daemon.named("overfull")) == 1 and not daemon.named("overfull_cleared")

        # Room again: cleared exactly once, below underfull.
        (disk / "filler-b").unlink()
        (disk / "filler-a").unlink()
        cleared = daemon.wait_for("overfull_cleared", timeout=WAIT_S)
        assert cleared["message"] == "store overfull condition cleared"
        assert cleared["usage_percent"] < underfull
        daemon.wait_for("disk_alert", timeout=WAIT_S, previous_alert_level=2)
        alerts = [(e["previous_alert_level"], e["alert_level"]) for e in daemon.named("disk_alert")]
        assert (None, 0) not in alerts and alerts[-1][1] in (0, 1)
        assert any(level == 2 for _prev, level in alerts)
        # Producers held back (level 2) is a warning; the way back is info.
        levels = {e["alert_level"]: e["level"] for e in daemon.named("disk_alert")}
        assert levels[2] == "warning" and levels[alerts[-1][1]] == "info", levels

        # The hook ran once per transition with the documented environment.
        deadline = time.monotonic() + WAIT_S
        while hook_log.exists() is False or hook_log.read_text().count("DISKGUARD_EVENT") < 2:
            assert time.monotonic() < deadline, "hook not called twice"
            time.sleep(0.05)
        calls = hook_log.read_text().strip().splitlines()
        assert "DISKGUARD_EVENT=overfull " in calls[0] and f"DISKGUARD_MOUNT={disk}" in calls[0]
        assert "DISKGUARD_USAGE_PERCENT=" in calls[0] and "DISKGUARD_FREE_BYTES=" in calls[0]
        assert "DISKGUARD_EVENT=overfull_cleared" in calls[1]

        # Metrics over real HTTP, health ok.
        url = f"http://127.0.0.1:{port}"
        body = urllib.request.urlopen(f"{url}/metrics", timeout=WAIT_S).read().decode()
        assert 'diskguard_filesystem_usage_ratio{device="' in body and str(disk) in body
        assert "diskguard_segments_deleted_total" in body
        assert "diskguard_filesystem_deleted_open_bytes{" in body
        assert urllib.request.urlopen(f"{url}/healthz", timeout=WAIT_S).status == 200

        # Snapshots spooled on transitions and on the timer: the one after the clear follows
        # a full rescan, which may take a while on a loaded machine.
        deadline = time.monotonic() + WAIT_S
        while {"overfull", "normal"} - {r["flow_state"] for r in spooled(state)}:
            assert time.monotonic() < deadline, spooled(state)
            time.sleep(0.1)
        records = spooled(state)
        assert records and all(r["schema"] == 1 and r["host"] == "test-host" for r in records)
        assert sum(r["deleted_bytes"] for r in records) > 0
        assert any(t["topic"] == "orders" for r in records for t in r["topics"])

        # SIGHUP: a bad config is rejected and the old one stays; a good one is taken.
        config.write_text(good.replace("disk_usage_percent", "disk_usage_persent"))
        daemon.signal(signal.SIGHUP)
        daemon.wait_for("config_reload_rejected", timeout=WAIT_S)
        assert daemon.proc.poll() is None
        config.write_text(good)
        daemon.signal(signal.SIGHUP)
        daemon.wait_for("config_reloaded", timeout=WAIT_S)

        # SIGTERM: clean exit 0.
        assert daemon.stop() == 0
        assert daemon.named("daemon_stopped")
        assert any("STOPPING=1" in m for m in notify.drain())
        assert all(e["event"] != "<not json>" for e in daemon.events), daemon.raw[:5]
