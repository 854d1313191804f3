"""Benchmark: ``diskguard aggregate`` end to end on 1M snapshot rows (target: < 60 s, 2 cores).

Generates a fleet (default 200 hosts x 2 mounts x 2500 snapshots, 4 topics each) as JSONL
spool files, then times the real CLI in a subprocess, Spark start-up included, and writes
``bench/results/aggregate.json``. Not part of the test suite::

    .venv/bin/python bench/bench_aggregate.py [--hosts 200 --mounts 2 --snapshots 2500]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = 1_790_000_000_000
STEP_MS = 60_000
TOTAL = 4_000_000_000_000
TOPICS = ("orders", "payments", "clicks", "audit")
TARGET_S = 60.0


def generate(spool: Path, hosts: int, mounts: int, snapshots: int, files: int = 8) -> int:
    """Write the fleet, one host per line group; returns the number of rows written."""
    spool.mkdir(parents=True, exist_ok=True)
    outs = [open(spool / f"{i:08d}.jsonl", "w", encoding="utf-8") for i in range(files)]  # noqa: SIM115
    rows = 0
    try:
        for h in range(hosts):
            host = f"broker-{h:04d}"
            out = outs[h % files]
            for m in range(mounts):
                mount = f"/data{m + 1}"
                rate = 1_000_000 * (1 + (h * mounts + m) % 97)  # bytes per minute
                used0 = 1_000_000_000_000 + h * 3_000_000_000 + m * 7_000_000_000
                lines = []
                for i in range(snapshots):
                    ts = T0 + i * STEP_MS
                    used = used0 + rate * i
                    state = "overfull" if (i // 100) % 10 == 9 and h % 5 == 0 else "normal"
                    topics = ",".join(
                        f'{{"topic":"{t}","partitions":{6 + k},"bytes":{used // (k + 2)}}}'
                        for k, t in enumerate(TOPICS)
                    )
                    lines.append(
                        f'{{"schema":1,"host":"{host}","ts_ms":{ts},"mount":"{mount}",'
                        f'"device":"/dev/sd{m}","log_dirs":["{mount}/kafka"],'
                        f'"total_bytes":{TOTAL},"used_bytes":{used},'
                        f'"available_bytes":{TOTAL - 200_000_000_000 - used},'
                        f'"kafka_bytes":{used - 5_000_000_000},"pending_reclaim_bytes":0,'
                        f'"deleted_bytes":{1000 if i % 50 == 0 else 0},"flow_state":"{state}",'
                        f'"alert_level":{2 if state == "overfull" else 0},"topics":[{topics}]}}\n'
                    )
                out.write("".join(lines))
                rows += snapshots
    finally:
        for f in outs:
            f.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--mounts", type=int, default=2)
    parser.add_argument("--snapshots", type=int, default=2500)
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument(
        "--results", type=Path, default=Path(__file__).parent / "results" / "aggregate.json"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="diskguard-bench-aggregate-"))
    try:
        spool = work / "spool"
        started = time.monotonic()
        rows = generate(spool, args.hosts, args.mounts, args.snapshots)
        gen_s = time.monotonic() - started
        size = sum(p.stat().st_size for p in spool.iterdir())
        print(f"generated {rows} rows ({size / 1e6:.0f} MB) in {gen_s:.1f} s", flush=True)

        diskguard = Path(sys.executable).parent / "diskguard"
        command = [
            str(diskguard),
            "aggregate",
            "--input",
            str(spool),
            "--output",
            str(work / "out"),
        ]
        started = time.monotonic()
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        elapsed = time.monotonic() - started
        if proc.returncode != 0:
            print(proc.stdout + proc.stderr, file=sys.stderr)
            print(f"aggregate failed with exit {proc.returncode}", file=sys.stderr)
            return 1
        summary = json.loads((work / "out" / "summary.json").read_text())
        result = {
            "rows": rows,
            "input_bytes": size,
            "hosts": args.hosts,
            "disks": len(summary["disks"]),
            "topics": len(summary["topics"]),
            "seconds": round(elapsed, 2),
            "rows_per_second": round(rows / elapsed),
            "target_seconds": TARGET_S,
            "within_target": elapsed < TARGET_S,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "stdout_first_line": proc.stdout.splitlines()[0] if proc.stdout else "",
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(result, indent=2) + "\n")
        print(
            f"aggregate: {rows} rows in {elapsed:.1f} s ({rows / elapsed:,.0f} rows/s, "
            f"Spark start-up included; target < {TARGET_S:.0f} s) -> {args.results}"
        )
        if proc.stderr.strip():
            print("stderr from aggregate:\n" + proc.stderr.strip())
        return 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
