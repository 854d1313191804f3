"""Every crash point of offline deletion, with the table for docs/reliability.md.

Runs the scenarios of ``tests/support/crashpoints.py`` (the same harness ``make test`` runs
in ``tests/reliability/test_reliability_crashpoints.py``): strace kills ``diskguard enforce
--once`` on entry of each of its file-system calls in turn, a clean re-run must converge.
Prints a Markdown
table (per scenario and syscall kind: crash points tried, killed there, converged) and writes
``bench/results/crashpoints.json``. Needs root (tmpfs mounts) and strace. ``--logs-fs ext4``
puts the log dirs on a loop ext4, where a batch fsyncs only the dir it changed last.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))

from support import crashpoints


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", nargs="*", default=list(crashpoints.SCENARIOS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--logs-fs",
        choices=crashpoints.LOGS_FILESYSTEMS,
        default="tmpfs",
        help="what the log dirs are on (ext4: loop-mounted, the one-fsync batches)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        help="default: bench/results/crashpoints.json (crashpoints-ext4.json with --logs-fs ext4)",
    )
    args = ap.parse_args(argv)
    if args.out is None:
        suffix = "" if args.logs_fs == "tmpfs" else f"-{args.logs_fs}"
        args.out = Path(__file__).resolve().parent / "results" / f"crashpoints{suffix}.json"
    crashpoints.require_strace()
    rows = []
    failures = 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="crashpoints-") as work:
        for name in args.scenarios:
            scenario = crashpoints.SCENARIOS[name]
            t0 = time.monotonic()
            ref, results = crashpoints.run_scenario(
                scenario, Path(work), workers=args.workers, logs_fs=args.logs_fs
            )
            took = time.monotonic() - t0
            tried: Counter[str] = Counter(r.syscall for r in results)
            killed: Counter[str] = Counter(r.syscall for r in results if r.killed)
            ok: Counter[str] = Counter(r.syscall for r in results if not r.problems)
            for r in results:
                if r.problems:
                    failures += 1
                    print(f"FAILED {name} {r.syscall} #{r.n}: {'; '.join(r.problems)}")
            rows.append(
                {
                    "scenario": name,
                    "description": scenario.description,
                    "segments_deleted": len(ref.gone_segments),
                    "swept": len(ref.swept),
                    "write_targets": ref.write_targets,
                    "tried": dict(tried),
                    "killed": dict(killed),
                    "converged": dict(ok),
                    "seconds": round(took, 1),
                }
            )
    total = time.monotonic() - started
    kinds = sorted({k for row in rows for k in row["tried"]})
    print("| scenario | " + " | ".join(kinds) + " | all | converged | time |")
    print("|---|" + "---|" * (len(kinds) + 3))
    for row in rows:
        cells = [str(row["tried"].get(k, 0)) for k in kinds]
        print(
            f"| {row['scenario']} | "
            + " | ".join(cells)
            + f" | {sum(row['tried'].values())} | {sum(row['converged'].values())}"
            + f" | {row['seconds']} s |"
        )
    print(f"total {sum(sum(r['tried'].values()) for r in rows)} crash points in {total:.0f} s")
    for row in rows:
        print(row["scenario"], "writes by target:", row["write_targets"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"logs_fs": args.logs_fs, "scenarios": rows, "seconds": round(total, 1)}, indent=1
        )
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
