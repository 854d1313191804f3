"""``check-config --connect``: the broker-facing checks, each one line; exit 2 when a configured
feature cannot work. Real-broker and stand-in runs are in their own suites."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _cfg(tmp_path: Path, broker: str = "") -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[broker]\nlog_dirs = ["{logs}"]\n{broker}\n[daemon]\nstate_dir = "{tmp_path / "s"}"\n'
    )
    return cfg


def _run(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diskguard", "check-config", "--connect", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_no_bootstrap_servers_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = _run(_cfg(tmp_path))
    assert proc.returncode == 2
    assert proc.stdout.splitlines()[-1] == (
        "FAIL: broker.bootstrap_servers is not set: nothing to connect to"
    )
    assert "Traceback" not in proc.stderr


def test_unreachable_broker_fails_cleanly(tmp_path: Path) -> None:
    proc = _run(_cfg(tmp_path, 'bootstrap_servers = "127.0.0.1:1"'))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("FAIL: broker 127.0.0.1:1: not reachable"), proc.stdout
    assert "Traceback" not in proc.stderr
    # stdout is the answer: no log lines mixed in.
    assert all(line.startswith(("ok", "FAIL", str(tmp_path))) for line in proc.stdout.splitlines())
