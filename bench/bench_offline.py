"""Micro-benchmark of the offline executor: segments deleted per second at scale.

A loop ext4 holds two identical log dirs of ``--partitions`` × ``--segments`` small
real-format segments (tests/kafkagen); on each, an executor runs once on a plan of
``--delete`` deletions, the oldest segments of every partition interleaved (the order the
planner emits: globally oldest first, so one cycle touches many partitions). Every guard
rail, audit line, journal record and fsync runs as in the daemon.

Baseline, in the same run on the same filesystem: the per-segment executor of commit
``BASELINE_COMMIT`` (before batching: six fsyncs per segment), loaded from git
(``git show COMMIT:daemon/diskguard/offline.py``) as a module of its own beside today's
``diskguard`` (it uses only audit/lockfile/model/planner APIs that still exist). Which one
runs first alternates per ``--rounds`` round, each on a fresh tree. Prints the ratio.
Needs root (loop mount) and git. Writes ``bench/results/offline.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))

import loopfs
from diskguard.retention.audit import AuditLog
from diskguard.retention.offline.fileexecutor import FileExecutor
from diskguard.retention.planner import Deletion
from machine import RESULTS, ROOT, machine_info
from support.kafkagen import SegmentSpec, write_log_dir

SEG = SegmentSpec(records=4, payload_size=200, records_per_batch=2)
#: main before offline batching (issue 15): one journal entry and six fsyncs per segment.
BASELINE_COMMIT = "ca081c3"


def load_baseline(tmp: Path) -> ModuleType:
    """The offline executor of ``BASELINE_COMMIT``, importable beside today's."""
    src = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{BASELINE_COMMIT}:daemon/diskguard/offline.py"],
        check=True,
        capture_output=True,
    ).stdout
    path = tmp / "offline_baseline.py"
    path.write_text(_today_paths(src.decode()))
    spec = importlib.util.spec_from_file_location("offline_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its frozen dataclasses look their module up
    spec.loader.exec_module(module)
    return module


#: The modules the baseline imports, at their paths since the package's subpackages (issue 14).
_MOVED = {
    "from diskguard import lockfile": "from diskguard.kafkalog import lockfile",
    "from diskguard.audit import (": "from diskguard.retention.planner import DeletionResult\n"
    "from diskguard.retention.audit import (",
    "    DeletionResult,\n": "",
    "from diskguard.model import": "from diskguard.kafkalog.model import",
    "from diskguard.planner import": "from diskguard.retention.planner import",
}


def _today_paths(source: str) -> str:
    """The baseline's source with its imports pointed at today's module paths (the APIs it
    uses are unchanged; only where they live moved)."""
    for old, new in _MOVED.items():
        assert old in source, f"baseline import not found: {old!r}"
        source = source.replace(old, new, 1)
    return source


def build(logs: Path, args: argparse.Namespace, per_partition: int, mnt: Path) -> list[Deletion]:
    layout = write_log_dir(
        logs,
        {("orders", p): [SEG] * args.segments for p in range(args.partitions)},
        segment_index_bytes=1 << 20,
    )
    plan: list[Deletion] = []
    for i in range(per_partition):
        for p in range(args.partitions):
            if len(plan) == args.delete:
                break
            part = layout.partitions[("orders", p)]
            seg = part.segments[i]
            files = tuple(str(f) for f in seg.files if f.exists())
            plan.append(
                Deletion(
                    log_dir=str(logs),
                    topic=part.topic,
                    partition=part.partition,
                    base_offset=seg.base_offset,
                    next_offset=seg.next_offset,
                    max_timestamp_ms=seg.max_timestamp_ms,
                    bytes=sum(os.lstat(f).st_blocks * 512 for f in files),
                    files=files,
                    mount=str(mnt),
                )
            )
    return plan


def run_one(executor_cls: Any, state: Path, plan: list[Deletion], mnt: Path) -> float:
    os.sync()
    executor = executor_cls(state, AuditLog(state / "audit.jsonl"))
    t0 = time.monotonic()
    results = executor.execute(plan, {str(mnt): 99.0})
    wall = time.monotonic() - t0
    ok = sum(r.ok for r in results)
    if ok != len(plan):
        bad = next(r for r in results if not r.ok)
        sys.exit(f"bench_offline: {len(plan) - ok} deletions failed, first: {bad.error}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--segments", type=int, default=100)
    ap.add_argument("--delete", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "offline.json")
    ap.add_argument("--image-dir", type=Path, default=Path("/var/tmp/diskguard-bench"))
    args = ap.parse_args()
    per_partition = -(-args.delete // args.partitions)
    if per_partition >= args.segments:
        sys.exit("bench_offline: --delete must leave every partition its active segment")
    args.image_dir.mkdir(parents=True, exist_ok=True)
    mnt = Path(tempfile.mkdtemp(prefix="offline-", dir=args.image_dir))
    image = args.image_dir / "offline.img"
    baseline = load_baseline(Path(tempfile.mkdtemp(prefix="offline-baseline-")))
    impls = {"batched": FileExecutor, "baseline": baseline.OfflineExecutor}
    walls: dict[str, list[float]] = {name: [] for name in impls}
    build_s = 0.0
    with loopfs.loop_fs(image, mnt, 2 << 30, 400_000, reuse=False, keep=False):
        for r in range(args.rounds):
            order = list(impls) if r % 2 == 0 else list(reversed(impls))
            for name in order:
                root = mnt / f"r{r}-{name}"
                t0 = time.monotonic()
                plan = build(root / "logs", args, per_partition, mnt)
                build_s = time.monotonic() - t0
                walls[name].append(run_one(impls[name], root / "state", plan, mnt))
                shutil.rmtree(root)  # the 2 GiB image holds two trees, not one per round
    n = args.delete
    best = {name: min(w) for name, w in walls.items()}
    rate = {name: n / best[name] for name in impls}
    ratio = rate["batched"] / rate["baseline"]
    out = {
        "partitions": args.partitions,
        "segments_per_partition": args.segments,
        "deletions": n,
        "rounds": args.rounds,
        "baseline_commit": BASELINE_COMMIT,
        "build_s": round(build_s, 2),
        "execute_s": {name: [round(x, 3) for x in w] for name, w in walls.items()},
        "execute_s_median": {name: round(statistics.median(w), 3) for name, w in walls.items()},
        "segments_per_s": {name: round(v, 1) for name, v in rate.items()},
        "ratio_batched_over_baseline": round(ratio, 2),
        "target_segments_per_s": 500,
        "target_met": rate["batched"] >= 500,
        "machine": machine_info(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name in impls:
        print(
            f"offline execute ({name}): {n} deletions over {args.partitions} partitions, best of "
            f"{args.rounds}: {best[name]:.2f} s = {rate[name]:.0f} segments/s"
        )
    print(f"ratio batched/baseline: {ratio:.1f}x (target >= 500 segments/s: {rate['batched']:.0f})")


if __name__ == "__main__":
    main()
