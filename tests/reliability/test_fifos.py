"""FIFOs where a log dir's own files belong never hang the tool (issue 11, item 8).

Opening a FIFO for reading blocks until a writer appears — in a log dir, never. The three
files every command reads in a log dir (the two checkpoints and ``.lock``) are replaced by
FIFOs on a real loop ext4; ``plan``, ``enforce --once`` and ``status`` must finish (a
subprocess timeout catches a hang), say what is wrong in one warning line, and delete only
what may go: never an active segment, never a protected topic, nothing at all while the
``.lock`` cannot be probed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from diskguard.host import safeopen
from diskguard.kafkalog import lockfile
from diskguard.kafkalog.checkpoints import read_checkpoint
from diskguard.kafkalog.serverprops import read_properties
from support.cli import run_cli
from support.configs import write_config
from support.disks import over_ceiling
from support.logdirs import build

MiB = 1024**2
TIMEOUT = 30.0


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return run_cli(*args, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"diskguard {' '.join(args[:2])} hung (FIFO opened for reading)")


def warning_lines(stderr: str, name: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:") and name in line]


def files_of(log_dir: Path) -> set[str]:
    return {str(p.relative_to(log_dir)) for p in log_dir.rglob("*")}


def over_limit(disk: Path, log_dir: Path, tmp_path: Path, mode: str) -> Path:
    limit = over_ceiling(disk, 4, digits=1)
    return write_config(tmp_path, log_dir, disk_usage_percent=limit, mode=mode, offline_headroom=0)


@pytest.mark.parametrize("name", ["cleaner-offset-checkpoint", "log-start-offset-checkpoint"])
def test_a_fifo_checkpoint_never_hangs_plan_enforce_or_status(
    disk: Path, tmp_path: Path, name: str
) -> None:
    log_dir, _truth = build(disk)
    (log_dir / name).unlink()
    os.mkfifo(log_dir / name)
    cfg = over_limit(disk, log_dir, tmp_path, "offline")
    actives = {
        str(max(part.glob("*.log")).relative_to(log_dir))
        for part in log_dir.iterdir()
        if part.is_dir()
    }
    protected = {f for f in files_of(log_dir) if f.startswith("__consumer_offsets")}

    # Offline, nobody reads log-start-offset-checkpoint (no broker will reclaim below it):
    # plan and enforce warn at most once; status always reads both checkpoints.
    for args in (("plan", "--json"), ("plan",), ("status",)):
        proc = cli(*args, "-c", str(cfg))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        lines = warning_lines(proc.stderr, name)
        assert len(lines) == (1 if args[0] == "status" else len(lines) and 1), proc.stderr
        assert all("not a regular file (FIFO)" in line for line in lines)
    proc = cli("status", "--json", "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    warnings = json.loads(proc.stdout)["warnings"]
    assert len([w for w in warnings if name in w and "FIFO" in w]) == 1, warnings
    (tmp_path / "dry").mkdir()
    dry = write_config(tmp_path / "dry", log_dir, disk_usage_percent=1.0, mode="dry-run")
    proc = cli("plan", "-c", str(dry))
    assert proc.returncode == 0 and len(warning_lines(proc.stderr, name)) == 1, proc.stderr

    proc = cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(warning_lines(proc.stderr, name)) <= 1, proc.stderr
    left = files_of(log_dir)
    assert actives <= left, "an active segment was deleted"
    assert protected <= left, "a protected topic's segment was deleted"
    assert (log_dir / name).is_fifo()


def test_a_fifo_lock_counts_as_held_offline_is_refused(disk: Path, tmp_path: Path) -> None:
    log_dir, _truth = build(disk)
    (log_dir / ".lock").unlink()
    os.mkfifo(log_dir / ".lock")
    cfg = over_limit(disk, log_dir, tmp_path, "offline")
    before = {str(p): os.lstat(p).st_ino for p in log_dir.rglob("*")}

    proc = cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert len(warning_lines(proc.stderr, ".lock")) == 1, proc.stderr
    assert "FIFO" in warning_lines(proc.stderr, ".lock")[0]
    (tmp_path / "auto").mkdir()
    auto = write_config(tmp_path / "auto", log_dir, disk_usage_percent=1.0, mode="auto")
    assert cli("enforce", "--once", "-c", str(auto)).returncode == 3

    proc = cli("plan", "--json", "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mode"] == "refused"
    proc = cli("status", "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert {str(p): os.lstat(p).st_ino for p in log_dir.rglob("*")} == before


@pytest.fixture()
def no_hang() -> Iterator[None]:
    """In-process reads: a blocking open of a FIFO fails the test after 10 s, not the run."""

    def _hung(_signum: int, _frame: object) -> None:
        pytest.fail("blocked opening a FIFO for 10 s")

    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_the_readers_refuse_a_fifo_at_once(tmp_path: Path, no_hang: None) -> None:
    """The edge functions themselves: an OSError naming the path, never a block."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(safeopen.NotRegularFile, match="fifo: not a regular file \\(FIFO\\)"):
        safeopen.open_regular(fifo)
    with pytest.raises(OSError, match="FIFO"):
        read_checkpoint(fifo)
    with pytest.raises(OSError, match="FIFO"):
        read_properties(fifo)
    (tmp_path / "real").write_text("0\n0\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(safeopen.NotRegularFile, match="symlink"):
        safeopen.open_regular(tmp_path / "link")
    assert read_checkpoint(tmp_path / "real") == {}
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    os.mkfifo(log_dir / ".lock")
    assert lockfile.held_by_other(log_dir), "an unprobeable .lock must count as held"
    with pytest.raises(lockfile.LockHeld), lockfile.hold(log_dir):
        pass
    assert (log_dir / ".lock").is_fifo()
