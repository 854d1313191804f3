"""Run every benchmark (``make bench``): plan vs du, daemon reaction/idle/stuck, Spark aggregation.

Each runs as its own process (a crash or a leaked mount in one does not hide the others'
numbers) and writes its JSON under ``bench/results/``. ``--quick`` shrinks the trees to a
few minutes in all, for checking that the harness works; the reported figures come from the
full run. Not part of the test suite: nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent

QUICK = {
    # Quick results go to files of their own, never over the full run's.
    "bench_plan.py": [
        "--partitions",
        "100",
        "--segments",
        "100",
        "--choose",
        "500",
        "--out",
        str(BENCH / "results" / "plan-quick.json"),
    ],
    "bench_reaction.py": [
        "--scenarios",
        "small",
        "--crossings",
        "20",
        "--idle-tree-partitions",
        "100",
        "--idle-seconds",
        "10",
        "--out",
        str(BENCH / "results" / "reaction-quick.json"),
    ],
    "bench_offline.py": [
        "--partitions",
        "20",
        "--segments",
        "10",
        "--delete",
        "100",
        "--rounds",
        "1",
        "--out",
        str(BENCH / "results" / "offline-quick.json"),
    ],
    "bench_stuck.py": [
        "--partitions",
        "20",
        "--segments",
        "5",
        "--seconds",
        "5",
        "--out",
        str(BENCH / "results" / "stuck-quick.json"),
    ],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small trees, short runs")
    ap.add_argument("--keep", action="store_true", help="keep the big tree images for next time")
    args = ap.parse_args(argv)
    scripts = ["bench_plan.py", "bench_reaction.py", "bench_offline.py", "bench_stuck.py"]
    if (BENCH / "bench_aggregate.py").exists():
        scripts.append("bench_aggregate.py")
    failed: list[str] = []
    for script in scripts:
        cmd = [sys.executable, str(BENCH / script)]
        if args.quick:
            cmd += QUICK.get(script, [])
        if args.keep and script in ("bench_plan.py", "bench_reaction.py"):
            cmd.append("--keep")
        if script == "bench_plan.py" and not args.quick:
            cmd.append("--profile")
        print(f"=== {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        rc = subprocess.call(cmd)
        print(f"=== {script}: exit {rc} after {time.monotonic() - started:.0f} s\n", flush=True)
        if rc != 0:
            failed.append(f"{script} (exit {rc})")
    if failed:
        print("FAILED: " + ", ".join(failed))
        return 1
    print(f"results in {BENCH / 'results'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
