"""stdout is the command's answer: with the broker down and librdkafka debugging on, `plan
--json` and `status --json` still print exactly one JSON document on stdout, `audit --json`
only JSON lines; logs go to stderr (issue 13 item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import json_events, run_cli
from support.configs import write_config


def _cfg(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    (logs / "orders-0").mkdir(parents=True)
    return write_config(
        tmp_path,
        logs,
        broker={"bootstrap_servers": "127.0.0.1:1", "client": {"debug": "broker,protocol"}},
        logging={"level": "debug"},
        state_dir=tmp_path / "s",
        name="c.toml",
        assume_delete_policy=None,
    )


@pytest.mark.parametrize("command", [["plan", "--json"], ["status", "--json"], ["audit", "--json"]])
def test_json_commands_keep_stdout_parseable_with_a_dead_broker(
    tmp_path: Path, command: list[str]
) -> None:
    proc = run_cli(*command, "-c", str(_cfg(tmp_path)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    if command[0] == "audit":
        # JSON lines, one per audit record (none yet): every stdout line parses.
        assert all(json.loads(line) for line in proc.stdout.splitlines())
    else:
        json.loads(proc.stdout)  # exactly one document, nothing else
    assert "Traceback" not in proc.stderr
    if command[0] == "plan":
        # The broker being down is said, on stderr, as JSON log lines.
        lines = json_events(proc.stderr)
        assert any(e.get("event") == "broker_unreachable" for e in lines), proc.stderr[-2000:]
