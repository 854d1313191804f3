"""A refusal on a held ``.lock`` names who holds it.

"is the broker running?" sent an operator looking for a broker when the holder was another
diskguard (a cron ``enforce --once`` mid-deletion beside the daemon, or a second rescue
started by hand). The holder is read from ``/proc/PID/cmdline``: another diskguard, a Kafka
broker, or any other process by its command line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from diskguard.kafkalog import lockfile
from support.cli import run_cli
from support.configs import write_config
from support.crashpoints import require_strace
from support.disks import over_ceiling
from support.kafkagen import hold_lock
from support.logdirs import build


def test_a_lock_held_by_another_diskguard_says_so(disk: Path, tmp_path: Path) -> None:
    require_strace()
    log_dir, _truth = build(disk)
    limit = over_ceiling(disk, 4, digits=1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_config(
        tmp_path / "a", log_dir, disk_usage_percent=limit, mode="offline", offline_headroom=0
    )
    second = write_config(tmp_path / "b", log_dir, disk_usage_percent=limit, mode="offline")
    # A real ``diskguard enforce --once``, held for 20 s at its first segment rename: it holds
    # the log dir's .lock then, as it does through every offline deletion.
    tracer = subprocess.Popen(
        [
            "strace",
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            "trace=renameat,renameat2",
            "-e",
            "inject=renameat,renameat2:delay_enter=20000000:when=1",
            sys.executable,
            "-m",
            "diskguard",
            "enforce",
            "--once",
            "-c",
            str(first),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while (pid := lockfile.holder_pid(log_dir)) is None:
            assert time.monotonic() < deadline, "the first run never took the .lock"
            assert tracer.poll() is None, tracer.communicate()
            time.sleep(0.05)
        assert pid > 0
        proc = run_cli("enforce", "--once", "-c", str(second))
        assert proc.returncode == 3, proc.stdout + proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert f"another diskguard (pid {pid}: " in line, line
        assert "enforce --once" in line, line
        assert "broker running" not in proc.stderr + proc.stdout, line
        plan = json.loads(run_cli("plan", "--json", "-c", str(second)).stdout)
        assert plan["mode"] == "refused" and f"another diskguard (pid {pid}" in plan["mode_reason"]
        auto = write_config(
            tmp_path / "b", log_dir, disk_usage_percent=limit, mode="auto", name="auto.toml"
        )
        proc = run_cli("enforce", "--once", "-c", str(auto))
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert f"another diskguard (pid {pid}: " in proc.stderr, proc.stderr
        assert "live broker" not in proc.stderr, proc.stderr
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # strace detaches; the run goes on at once
        out, err = tracer.communicate(timeout=60)
    # The first run was not disturbed: it finished its deletions.
    assert tracer.returncode == 0, out + err


def test_a_lock_held_by_a_broker_or_another_process_names_it(disk: Path, tmp_path: Path) -> None:
    log_dir, _truth = build(disk)
    limit = over_ceiling(disk, 4, digits=1)
    cfg = write_config(tmp_path, log_dir, disk_usage_percent=limit, mode="offline")
    with hold_lock(log_dir, argv_tail=["kafka.Kafka", "config/server.properties"]) as pid:
        proc = run_cli("enforce", "--once", "-c", str(cfg))
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert f"a Kafka broker (pid {pid})" in proc.stderr, proc.stderr
    with hold_lock(log_dir) as pid:
        proc = run_cli("enforce", "--once", "-c", str(cfg))
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert f"pid {pid} ({Path(sys.executable).name} -c " in proc.stderr, proc.stderr
    assert os.path.exists(log_dir / ".lock")
