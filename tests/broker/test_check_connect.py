"""``check-config --connect``: the broker-facing checks, each one line; exit 2 when a configured
feature cannot work. Real-broker and stand-in runs are in their own suites."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.cli import run_cli
from support.configs import write_config


def _cfg(tmp_path: Path, **broker: object) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    return write_config(
        tmp_path,
        logs,
        broker=broker,
        state_dir=tmp_path / "s",
        name="c.toml",
        assume_delete_policy=None,
    )


def _run(cfg: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("check-config", "--connect", "-c", str(cfg))


def test_no_bootstrap_servers_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = _run(_cfg(tmp_path))
    assert proc.returncode == 2
    assert proc.stdout.splitlines()[-1] == (
        "FAIL: broker.bootstrap_servers is not set: nothing to connect to"
    )
    assert "Traceback" not in proc.stderr


def test_unreachable_broker_fails_cleanly(tmp_path: Path) -> None:
    proc = _run(_cfg(tmp_path, bootstrap_servers="127.0.0.1:1"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("FAIL: broker 127.0.0.1:1: not reachable"), proc.stdout
    assert "Traceback" not in proc.stderr
    # stdout is the answer: no log lines mixed in.
    assert all(line.startswith(("ok", "FAIL", str(tmp_path))) for line in proc.stdout.splitlines())
