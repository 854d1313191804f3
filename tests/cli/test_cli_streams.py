"""stdout is the command's answer: with the broker down and librdkafka debugging on, `plan
--json` and `status --json` still print exactly one JSON document on stdout, `audit --json`
only JSON lines; logs go to stderr (issue 13 item 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _cfg(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    (logs / "orders-0").mkdir(parents=True)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[broker]\nlog_dirs = ["{logs}"]\nbootstrap_servers = "127.0.0.1:1"\n'
        'client = { "debug" = "broker,protocol" }\n'
        f'[logging]\nlevel = "debug"\n[daemon]\nstate_dir = "{tmp_path / "s"}"\n'
    )
    return cfg


@pytest.mark.parametrize("command", [["plan", "--json"], ["status", "--json"], ["audit", "--json"]])
def test_json_commands_keep_stdout_parseable_with_a_dead_broker(
    tmp_path: Path, command: list[str]
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "diskguard", *command, "-c", str(_cfg(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    if command[0] == "audit":
        # JSON lines, one per audit record (none yet): every stdout line parses.
        assert all(json.loads(line) for line in proc.stdout.splitlines())
    else:
        json.loads(proc.stdout)  # exactly one document, nothing else
    assert "Traceback" not in proc.stderr
    if command[0] == "plan":
        # The broker being down is said, on stderr, as JSON log lines.
        lines = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
        assert any(e.get("event") == "broker_unreachable" for e in lines), proc.stderr[-2000:]
