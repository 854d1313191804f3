"""Start-up cost of ``diskguard check-config`` / ``plan --json`` / ``status --json`` (issue 15).

What a one-shot command pays before it does any work: interpreter, imports, config. Measured
as the wall time of each command on a config whose one log dir is empty (nothing to scan), with
byte-code compiled as an installed package has it, against a baseline: the same commands from
another commit (``--baseline REV``, default the commit before lazy command loading), exported
with ``git archive`` and run in alternation with this checkout's; ``--also REV`` (repeatable)
adds more commits to the same alternation (e.g. main before the start-up work). Prints
medians, ``python -c pass`` (the interpreter's own floor) and the load average, writes
``bench/results/startup.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "check-config": ["check-config"],
    "plan --json": ["plan", "--json"],
    "status --json": ["status", "--json"],
}
#: main before commands were listed once and imported when run.
DEFAULT_BASELINE = "2258113"


def _export(rev: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "daemon"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "daemon"


def _env(pythonpath: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(pythonpath)
    return env


def _refuse_a_crash(which: str, name: str, proc: subprocess.CompletedProcess[bytes]) -> None:
    """Stop at a command that crashed: the time it took to fail is not a start-up time (a
    baseline whose dependencies this venv lacks fails at its first import, fast)."""
    if proc.returncode == 1 or b"Traceback" in proc.stderr:
        last = (proc.stderr.decode(errors="replace").strip().splitlines() or ["(no stderr)"])[-1]
        raise SystemExit(f"{which}: `diskguard {name}` crashed (exit {proc.returncode}): {last}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE)
    ap.add_argument("--also", action="append", default=[], metavar="REV", help="another baseline")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "startup.json"))
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="diskguard-bench-startup-"))
    (work / "logs").mkdir()
    config = work / "diskguard.toml"
    config.write_text(
        f'[broker]\nlog_dirs = ["{work / "logs"}"]\n[daemon]\nstate_dir = "{work / "state"}"\n'
    )
    trees = {"current": ROOT / "daemon", "baseline": _export(args.baseline, work)}
    for rev in args.also:
        (work / rev).mkdir()
        trees[rev] = _export(rev, work / rev)
    load_before = os.getloadavg()
    for tree in trees.values():  # byte-code, as pip install leaves it
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(tree)],
            env=_env(tree),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    times: dict[str, dict[str, list[float]]] = {w: {c: [] for c in COMMANDS} for w in trees}
    bare: list[float] = []
    for i in range(args.runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t)
        for which in list(trees) if i % 2 == 0 else reversed(list(trees)):
            for name, cmd in COMMANDS.items():
                t = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, "-m", "diskguard", *cmd, "-c", str(config)],
                    env=_env(trees[which]),
                    capture_output=True,
                    check=False,
                )
                times[which][name].append(time.perf_counter() - t)
                _refuse_a_crash(which, name, proc)
    result = {
        "benchmark": "startup",
        "baseline": args.baseline,
        "also": args.also,
        "runs": args.runs,
        "python_bare_ms": round(statistics.median(bare) * 1000, 1),
        "median_ms": {
            w: {c: round(statistics.median(v) * 1000, 1) for c, v in cs.items()}
            for w, cs in times.items()
        },
        # The least disturbed run: on a shared machine the most stable figure to compare.
        "min_ms": {
            w: {c: round(min(v) * 1000, 1) for c, v in cs.items()} for w, cs in times.items()
        },
        "load_average_before": load_before,
        "load_average": os.getloadavg(),
    }
    print(f"python -c pass: {result['python_bare_ms']} ms (median of {args.runs})")
    print(f"load average before / after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}")
    for name in COMMANDS:
        cur, base = result["median_ms"]["current"][name], result["median_ms"]["baseline"][name]
        line = f"{name:14s} current {cur:6.1f} ms   baseline {base:6.1f} ms"
        line += f"   ratio {cur / base:.2f}"
        for rev in args.also:
            other = result["median_ms"][rev][name]
            line += f"   {rev} {other:6.1f} ms   ratio {cur / other:.2f}"
        print(line)
    best = result["min_ms"]
    print(
        "fastest run:",
        ", ".join(f"{w} {' / '.join(str(v) for v in cs.values())}" for w, cs in best.items()),
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
