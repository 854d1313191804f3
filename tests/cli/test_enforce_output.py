"""``enforce --once`` talks to whoever runs it: on a terminal one summary line (events on
stderr, readable), otherwise — or with ``--json`` — the JSON event stream on stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from support import kafkagen
from support.cli import run_cli
from support.configs import write_config
from support.disks import ceiling_under
from support.terminal import on_a_terminal

MiB = 1024 * 1024


def _setup(tmpfs: Callable[[int], Path], tmp_path: Path) -> Path:
    mount = tmpfs(64 * MiB)
    log_dir = mount / "kafka"
    specs = [
        kafkagen.SegmentSpec(
            records=20,
            payload_size=2000,
            first_timestamp_ms=1_700_000_000_000 + s * 100_000,
            timestamp_step_ms=1000,
            records_per_batch=5,
        )
        for s in range(6)
    ]
    kafkagen.write_partition(log_dir, "orders", 0, specs)
    limit = ceiling_under(mount, 1)
    return write_config(
        tmp_path,
        log_dir,
        state_dir=tmp_path / "s",
        name="c.toml",
        disk_usage_percent=round(limit, 6),
    )


def test_a_terminal_gets_one_summary_line(tmpfs: Callable[[int], Path], tmp_path: Path) -> None:
    cfg = _setup(tmpfs, tmp_path)
    out, rc = on_a_terminal(
        [sys.executable, "-m", "diskguard", "enforce", "--once", "-c", str(cfg)]
    )
    lines = [x for x in out.replace("\r", "").splitlines() if x]
    assert rc == 0, out
    assert len(lines) == 1 and lines[0].startswith("diskguard enforce: 1 segment deleted ("), lines
    assert "offline" in lines[0] and "exit 0" in lines[0] and " → " in lines[0]


def test_not_a_terminal_or_json_gets_json_lines(
    tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    cfg = _setup(tmpfs, tmp_path)
    for run, extra in enumerate(([], ["--json"])):
        proc = run_cli("enforce", "--once", "-c", str(cfg), *extra)
        assert proc.returncode == 0, proc.stderr
        events = [json.loads(line)["event"] for line in proc.stdout.splitlines()]
        assert events or run == 1, proc.stderr  # the first run deletes; the second need not
        assert not proc.stdout.startswith("diskguard enforce:")
    out, _rc = on_a_terminal(
        [sys.executable, "-m", "diskguard", "enforce", "--once", "--json", "-c", str(cfg)]
    )
    for line in out.replace("\r", "").splitlines():
        json.loads(line)
