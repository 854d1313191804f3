"""CPU and log volume of ``diskguard run`` stuck over its limit (issue 11, item 7).

One loop ext4 holds a log dir of ``--partitions`` × ``--segments`` small real-format segments
(tests/kafkagen) and a filler; the daemon runs as its own process, over its ceiling, where
nothing more can be done:

- ``unreachable``: every topic protected (``protect_topics = [".*"]``): only protected
  segments left;
- ``refused``: mode offline while another process holds ``.lock`` (a POSIX lock, as a
  broker's);
- ``dry-run``: mode dry-run;
- ``read-only``: the filesystem remounted read-only, as ext4 does after a disk error
  (``errors=remount-ro``), every topic's policy assumed ``delete``: every deletion the
  daemon tries fails (the ``.lock`` cannot be taken);

and, as the baseline of the same run, ``idle``: the same tree under its ceiling. For each,
after start-up and a settle time, CPU (utime + stime from ``/proc/PID/stat``) and stdout
lines are counted over ``--seconds``. With ``--pre-fix REV`` the same scenarios also run the
daemon code of git revision REV (extracted with ``git archive``), the behaviour before the
fix. Needs root (loop mount). Writes ``bench/results/stuck.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))

import loopfs
from machine import RESULTS, ROOT, machine_info
from support import configs
from support.kafkagen import SegmentSpec, hold_lock, write_log_dir

SEG = SegmentSpec(records=4, payload_size=2000, records_per_batch=2)
SCENARIOS = ("idle", "unreachable", "refused", "dry-run", "read-only")


def cpu_seconds(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_config(path: Path, log_dir: Path, state: Path, scenario: str, limit: float) -> None:
    mode = {"refused": "offline", "dry-run": "dry-run"}.get(scenario, "offline")
    configs.write_config(
        path.parent,
        log_dir,
        state_dir=state,
        name=path.name,
        # Offline nothing tells the topics' cleanup policy: all protected, unless assumed.
        # The read-only case needs segments the daemon would delete.
        assume_delete_policy=[".*"] if scenario == "read-only" else None,
        disk_usage_percent=99.0 if scenario == "idle" else limit,
        mode=mode,
        offline_headroom=0,
        protect_topics=[".*"] if scenario == "unreachable" else None,
    )


def extract(rev: str, into: Path) -> Path:
    """``daemon/`` of git revision ``rev`` under ``into``; returns the import path."""
    archive = into / "src.tar"
    with open(archive, "wb") as fh:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "daemon"], stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "daemon"


def run_daemon(config: Path, pythonpath: Path, settle: float, seconds: float) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "diskguard", "run", "-c", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(pythonpath)},
    )
    lines: list[bytes] = []
    started = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if b'"daemon_started"' in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not started.wait(120):
            raise RuntimeError("the daemon did not start within 120 s")
        time.sleep(settle)
        n0, c0, t0 = len(lines), cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        n1, c1, t1 = len(lines), cpu_seconds(proc.pid), time.monotonic()
        size = sum(len(line) for line in lines[n0:n1])
        events: dict[str, int] = {}
        for line in lines[n0:n1]:
            with contextlib.suppress(ValueError):
                name = json.loads(line).get("event", "?")
                events[name] = events.get(name, 0) + 1
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
    wall = t1 - t0
    return {
        "cpu_percent": round(100 * (c1 - c0) / wall, 2),
        "cpu_s": round(c1 - c0, 2),
        "lines": n1 - n0,
        "lines_per_s": round((n1 - n0) / wall, 2),
        "log_bytes": size,
        "events": events,
        "seconds": round(wall, 1),
    }


@contextlib.contextmanager
def stuck_by(scenario: str, log_dir: Path, mnt: Path) -> Iterator[None]:
    """What keeps the daemon from freeing space in ``scenario``, for as long as it runs."""
    if scenario == "refused":
        with hold_lock(log_dir):
            yield
    elif scenario == "read-only":
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        try:
            yield
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
    else:
        yield


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--segments", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--pre-fix", metavar="REV", help="also run the daemon code of this revision")
    ap.add_argument("--image-dir", type=Path, default=Path("/var/tmp/diskguard-bench"))
    ap.add_argument("--out", type=Path, default=RESULTS / "stuck.json")
    args = ap.parse_args()
    args.image_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="stuck-", dir=args.image_dir))
    versions = {"current": ROOT / "daemon"}
    if args.pre_fix:
        versions[f"pre-fix {args.pre_fix}"] = extract(args.pre_fix, work)
    mnt = work / "mnt"
    mnt.mkdir()
    results: dict[str, dict[str, Any]] = {}
    image = args.image_dir / "stuck.img"
    with loopfs.loop_fs(image, mnt, 1 << 30, 100_000, reuse=False, keep=False):
        log_dir = mnt / "logs"
        write_log_dir(
            log_dir,
            {(f"t{p % 10}", p): [SEG] * args.segments for p in range(args.partitions)},
            segment_index_bytes=1 << 20,
        )
        st = os.statvfs(mnt)
        filler = mnt / "filler"
        left = int(st.f_bavail * st.f_frsize * 0.4)
        with open(filler, "wb") as fh:
            while left > 0:
                left -= fh.write(b"\xa5" * min(left, 1 << 20))
        os.sync()
        _total, _used, usage = loopfs.statvfs_usage(mnt)
        limit = round(usage - 5, 2)
        for version, path in versions.items():
            for scenario in SCENARIOS:
                state = work / f"state-{len(results)}"
                config = work / f"{len(results)}.toml"
                write_config(config, log_dir, state, scenario, limit)
                with stuck_by(scenario, log_dir, mnt):
                    got = run_daemon(config, path, args.settle, args.seconds)
                results.setdefault(version, {})[scenario] = got
                print(
                    f"{version:>22} {scenario:>12}: CPU {got['cpu_percent']:6.2f} %, "
                    f"{got['lines_per_s']:8.2f} lines/s ({got['log_bytes']} bytes in "
                    f"{got['seconds']} s)",
                    flush=True,
                )
    out = {
        "partitions": args.partitions,
        "segments_per_partition": args.segments,
        "usage_percent": round(usage, 2),
        "limit_percent": limit,
        "results": results,
        "machine": machine_info(),
    }
    shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
