"""Every line the daemon writes is JSON (issue 13 item 6): its events on stdout, and any
library's own logging (watchdog at shutdown) bridged to JSON ``library_log`` events."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from support.configs import write_config
from support.daemonproc import DaemonProc


def test_daemon_start_and_stop_write_only_json_lines(
    tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    mount = tmpfs(16 * 1024 * 1024)
    (mount / "kafka" / "orders-0").mkdir(parents=True)
    cfg = write_config(
        tmp_path,
        mount / "kafka",
        state_dir=tmp_path / "s",
        name="c.toml",
        assume_delete_policy=None,
        check_interval="200ms",
    )
    daemon = DaemonProc(cfg)
    try:
        daemon.wait_for("daemon_started", timeout=30)
        (mount / "kafka" / "orders-0" / "x").write_bytes(b"1")  # an inotify event or two
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert daemon.raw, "no output at all"
    for line in daemon.raw:
        json.loads(line)
    assert daemon.proc.stderr is not None
    for line in daemon.proc.stderr.read().splitlines():
        json.loads(line)


def test_library_logging_becomes_json_events() -> None:
    script = (
        "import logging, sys\n"
        "from diskguard.logs import configure_logging\n"
        "configure_logging('json', 'info', stream=sys.stdout)\n"
        "logging.getLogger('watchdog.observers.inotify_buffer').warning('queue %s', 'inactive')\n"
        "logging.getLogger('chatty').info('not shown below warning')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stderr == ""
    (event,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert event["event"] == "library_log" and event["level"] == "warning"
    assert event["logger"] == "watchdog.observers.inotify_buffer"
    assert event["message"] == "queue inactive"


def test_sigusr2_writes_every_threads_stack_to_stderr_and_the_daemon_goes_on(
    tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    """For a daemon that seems stuck: ``kill -USR2`` shows where each thread is (the journal
    gets stderr), and the daemon keeps guarding. stderr is not JSON then: a dump is for a
    human reading the journal, and only happens when one asks for it."""
    mount = tmpfs(16 * 1024 * 1024)
    (mount / "kafka" / "orders-0").mkdir(parents=True)
    cfg = write_config(
        tmp_path, mount / "kafka", state_dir=tmp_path / "s", name="c.toml", check_interval="200ms"
    )
    daemon = DaemonProc(cfg)
    try:
        daemon.wait_for("daemon_started", timeout=30)
        time.sleep(1.0)  # past the start-up: the loop and every thread running
        daemon.proc.send_signal(signal.SIGUSR2)
        time.sleep(1.0)
        assert daemon.proc.poll() is None  # still running
        (mount / "kafka" / "orders-0" / "x").write_bytes(b"1")
        time.sleep(0.5)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert daemon.proc.stderr is not None
    dump = daemon.proc.stderr.read()
    assert "most recent call first" in dump, dump[:500]
    assert "in _iteration" in dump  # the main thread, in the loop
    assert "brokerprobe.py" in dump  # and the others, e.g. the broker probe's
    assert daemon.named("daemon_stopped")
