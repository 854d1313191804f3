"""Micro-benchmark of the offline executor: segments deleted per second at scale.

A loop ext4 holds one log dir of ``--partitions`` × ``--segments`` small real-format segments
(tests/kafkagen); ``OfflineExecutor.execute`` runs once on a plan of ``--delete`` deletions,
the oldest segments of every partition interleaved (the order the planner emits: globally
oldest first, so one cycle touches many partitions). Every guard rail, audit line, journal
record and fsync runs as in the daemon. Needs root (loop mount). Writes
``bench/results/offline.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import loopfs
from diskguard.audit import AuditLog
from diskguard.offline import OfflineExecutor
from diskguard.planner import Deletion
from kafkagen import SegmentSpec, write_log_dir
from machine import RESULTS, machine_info

SEG = SegmentSpec(records=4, payload_size=200, records_per_batch=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--segments", type=int, default=100)
    ap.add_argument("--delete", type=int, default=2000)
    ap.add_argument("--image-dir", type=Path, default=Path("/var/tmp/diskguard-bench"))
    args = ap.parse_args()
    per_partition = -(-args.delete // args.partitions)
    if per_partition >= args.segments:
        sys.exit("bench_offline: --delete must leave every partition its active segment")
    args.image_dir.mkdir(parents=True, exist_ok=True)
    mnt = Path(tempfile.mkdtemp(prefix="offline-", dir=args.image_dir))
    image = args.image_dir / "offline.img"
    with loopfs.loop_fs(image, mnt, 2 << 30, 200_000, reuse=False, keep=False):
        logs, state = mnt / "logs", mnt / "state"
        t0 = time.monotonic()
        layout = write_log_dir(
            logs,
            {("orders", p): [SEG] * args.segments for p in range(args.partitions)},
            segment_index_bytes=1 << 20,
        )
        build_s = time.monotonic() - t0
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
        os.sync()
        executor = OfflineExecutor(state, AuditLog(state / "audit.jsonl"))
        t0 = time.monotonic()
        results = executor.execute(plan, {str(mnt): 99.0})
        wall = time.monotonic() - t0
        ok = sum(r.ok for r in results)
        if ok != len(plan):
            bad = next(r for r in results if not r.ok)
            sys.exit(f"bench_offline: {len(plan) - ok} deletions failed, first: {bad.error}")
    out = {
        "partitions": args.partitions,
        "segments_per_partition": args.segments,
        "deletions": len(plan),
        "build_s": round(build_s, 2),
        "execute_s": round(wall, 3),
        "segments_per_s": round(len(plan) / wall, 1),
        "machine": machine_info(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "offline.json").write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"offline execute: {len(plan)} deletions over {args.partitions} partitions in "
        f"{wall:.2f} s = {len(plan) / wall:.0f} segments/s"
    )


if __name__ == "__main__":
    main()
