"""diskguard as an operator runs it: a config file, ``diskguard run``, ``diskguard enforce``.

Everything goes through the public command line and the JSON events it prints; the config
is written out for the user to read (every value is explained in it).
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

#: KIP-61's ceiling and the level a cycle deletes down to (df's Use%).
CEILING_PERCENT = 60
TARGET_PERCENT = 50
#: Qpid's limits: producers held back at overfull, released below underfull.
OVERFULL_PERCENT = 75
UNDERFULL_PERCENT = 65
SNAPSHOTS_TOPIC = "diskguard.snapshots"
SNAPSHOT_INTERVAL = "2s"
HOST = "demo-broker-1"


def config_text(
    sandbox: Path,
    log_dir: Path,
    bootstrap: str,
    server_properties: Path,
    state_dir: Path,
) -> str:
    """The daemon's config (strings as JSON: valid TOML basic strings)."""
    q = json.dumps
    return f"""# Written by `python -m diskguard_demo` for the sandbox {sandbox}.
# The broker's disk is a {log_dir.parent} loop ext4 of its own; the limits are percentages
# of it, as df shows them.

[broker]
log_dirs = [{q(str(log_dir))}]
bootstrap_servers = {q(bootstrap)}
# The broker's own file: allow.everyone.if.no.acl.found (what the acl hold adds beside its
# DENY WRITE) and the retention-check settings when DescribeConfigs cannot say.
server_properties = {q(str(server_properties))}

[retention]
# auto: DeleteRecords through the broker while it answers; offline (segment files deleted
# directly) only while no broker holds the log dir's .lock. Production's default too.
mode = "auto"
# KIP-61: above {CEILING_PERCENT} % used, delete the globally oldest closed segments down to
# {TARGET_PERCENT} %. In broker mode the broker frees them only at its next retention check,
# so diskguard asks ahead, from the growth rate and the broker's reclaim latency.
disk_usage_percent = {CEILING_PERCENT}
target_percent = {TARGET_PERCENT}

[flow_control]
# Qpid Broker-J: producers held back at {OVERFULL_PERCENT} %, released below {UNDERFULL_PERCENT} %.
overfull_percent = {OVERFULL_PERCENT}
underfull_percent = {UNDERFULL_PERCENT}
# A DENY WRITE ACL for every producer (User:*) on the topics of the overfull disk: the broker
# refuses their writes (TOPIC_AUTHORIZATION_FAILED) until the disk clears.
actuators = ["acl"]
acl_principal = "User:*"

[snapshots]
interval = "{SNAPSHOT_INTERVAL}"
topic = "{SNAPSHOTS_TOPIC}"
host = "{HOST}"

[logging]
format = "json"
level = "info"

[daemon]
state_dir = {q(str(state_dir))}
"""


def _diskguard(*args: str) -> list[str]:
    return [sys.executable, "-m", "diskguard", *args]


def parse_line(line: str) -> dict[str, Any]:
    """One line of the daemon's output as an event (a non-JSON line as ``<text>``)."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    return event if isinstance(event, dict) else {"event": "<text>", "line": line.rstrip()}


class DaemonProcess:
    """``diskguard run`` as a subprocess; its JSON lines go to a log file and a queue."""

    def __init__(self, config: Path, log_path: Path) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.command = _diskguard("run", "-c", str(config))
        self._log = log_path.open("a", encoding="utf-8")
        self.proc = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            self.events.put(parse_line(line))

    def exited(self) -> int | None:
        return self.proc.poll()

    def dump_threads(self) -> None:
        """``kill -USR2``: the daemon writes every thread's stack to its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR2)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (what ``systemctl stop`` sends), SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        self._log.close()
        return self.proc.returncode


def enforce_once(
    config: Path, log_path: Path, timeout: float = 300
) -> tuple[int, list[dict[str, Any]]]:
    """``diskguard enforce --once --json``: its exit code and its events (also in
    ``log_path``)."""
    proc = subprocess.run(
        _diskguard("enforce", "--once", "--json", "-c", str(config)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    log_path.write_text(proc.stdout + proc.stderr)
    lines = (proc.stdout + "\n" + proc.stderr).splitlines()
    return proc.returncode, [parse_line(line) for line in lines if line.strip()]


def plan(config: Path, timeout: float = 120) -> dict[str, Any]:
    """``diskguard plan --json``: what would go now and what never may (``protected``)."""
    proc = subprocess.run(
        _diskguard("plan", "--json", "-c", str(config)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        answer = None
    if proc.returncode != 0 or not isinstance(answer, dict):
        raise RuntimeError(f"diskguard plan exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return answer


def aggregate(source: str, output: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``diskguard aggregate`` (embedded Spark, ``local[*]``)."""
    return subprocess.run(
        _diskguard("aggregate", "--input", source, "--output", str(output)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
