"""Benchmark: ``aggregate`` over one new day with 30 days already summarised, vs a full
recompute of all 31 days (target: the new day costs <= 1/10; both give the same report).

The fleet is ``bench_aggregate``'s (every disk growing steadily, overfull stretches, 4
topics), by default 1,000 brokers x 4 disks, a snapshot a minute (``--interval-minutes``):
~5.8M rows a day, written
per UTC day as gzipped JSON lines (``--data DIR`` keeps and reuses them: 31 days are ~10 GB
and take a while to write). The 30 days of history are folded once into a summaries
directory (``--summaries``; timed as "fold of the history"), which every measured
incremental run starts from a fresh copy of. Then, in alternating runs on the same machine:

- incremental: ``aggregate --input <day 31> --summaries <copy>``;
- full recompute: ``aggregate --input <all 31 days>`` (no summaries, as before this work);

and their outputs compared (disks/topics/hosts and summary.json, without the time of
generation and the source). ``--masters`` picks local mode (the CLI, ``local[*]``) and/or a
standalone master + worker started from the installed pyspark's ``spark-class`` (the job
through ``spark-submit --py-files``, as docs/aggregate.md shows). The 1-minute load average
and the CPU seconds of every run are recorded: the machine is shared. Writes
``bench/results/incremental.json``. Not part of the test suite::

    .venv/bin/python bench/bench_incremental.py --data /var/tmp/fleet31 --keep
    .venv/bin/python bench/bench_incremental.py --hosts 50 --days 5   # a quick check
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_aggregate as fleet

REPO = Path(__file__).resolve().parents[1]
DAY0 = 20_718 * 86_400_000  # 2026-09-22 00:00 UTC: the history starts at a UTC midnight
TOTAL = 100_000_000_000_000  # 100 TB disks: 31 days of growth stay well under full
TARGET_RATIO = 0.1


def _write_file(job: tuple[Path, int, int, int, int, int, int]) -> int:
    """One gzipped file: day ``day``'s snapshots of the hosts ``h % files == index``."""
    path, day, index, files, hosts, mounts, minutes = job
    per_day = 1440 // minutes
    rows = 0
    temp = path.with_suffix(".tmp")
    with gzip.open(temp, "wt", encoding="utf-8", compresslevel=1) as out:
        for h in range(index, hosts, files):
            for m in range(mounts):
                first = day * per_day
                step = minutes * 60_000
                out.write(fleet.disk_lines(h, m, mounts, first, per_day, DAY0, TOTAL, step))
                rows += per_day
    temp.rename(path)
    return rows


def generate(data: Path, hosts: int, mounts: int, days: int, files: int, minutes: int) -> None:
    """``data/day-NNN/*.jsonl.gz`` for the ``days`` of history and ``data/new-NNN/`` for the
    day after them; files already there are kept (a generation that stopped resumes)."""
    params = {"hosts": hosts, "mounts": mounts, "days": days, "files": files, "minutes": minutes}
    marker = data / "params.json"
    if marker.exists() and json.loads(marker.read_text()) != params:
        raise SystemExit(f"{data} holds another fleet ({marker.read_text().strip()})")
    data.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(params) + "\n")
    jobs = []
    for day in range(days + 1):
        directory = data / f"{'new' if day == days else 'day'}-{day:03d}"
        directory.mkdir(parents=True, exist_ok=True)
        for index in range(files):
            path = directory / f"{index:03d}.jsonl.gz"
            if not path.exists():
                jobs.append((path, day, index, files, hosts, mounts, minutes))
    if not jobs:
        return
    started = time.monotonic()
    with multiprocessing.Pool(os.cpu_count() or 1) as pool:
        rows = sum(pool.imap_unordered(_write_file, jobs))
    print(f"generated {rows} rows in {time.monotonic() - started:.0f} s", flush=True)


def run(command: list[str], env: dict[str, str], args: list[str]) -> dict[str, Any]:
    """One aggregate run: wall and CPU seconds (driver, JVMs, Python workers), load around."""
    load_before = os.getloadavg()[0]
    cpu_before = fleet._children_cpu()
    started = time.monotonic()
    proc = subprocess.run(command + args, capture_output=True, text=True, check=False, env=env)
    elapsed = time.monotonic() - started
    # Reap the adopted JVMs, so that their CPU time counts; without blocking: a standalone
    # master and worker are children too, and live on (waiting for them waited forever).
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < 2.0:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            quiet_since = time.monotonic()
        else:
            time.sleep(0.1)
    if proc.returncode != 0:
        raise RuntimeError(f"aggregate exited {proc.returncode}: {proc.stderr[-3000:]}")
    return {
        "seconds": round(elapsed, 1),
        "cpu_seconds": round(fleet._children_cpu() - cpu_before, 1),
        "load1_before": round(load_before, 2),
        "load1_after": round(os.getloadavg()[0], 2),
        "stdout": proc.stdout.splitlines()[:2],
    }


def _say(what: str, r: dict[str, Any]) -> None:
    print(
        f"{what}: {r['seconds']} s, CPU {r['cpu_seconds']} s"
        f" (load {r['load1_before']} -> {r['load1_after']})",
        flush=True,
    )


def comparable(out: Path) -> dict[str, Any]:
    """What must be equal between the two runs' outputs."""
    import pyarrow.parquet as pq

    summary = json.loads((out / "summary.json").read_text())
    for key in ("generated_at", "source", "summaries"):
        summary.pop(key, None)
    tables = {
        name: pq.read_table(out / f"{name}.parquet").to_pylist()
        for name in ("disks", "topics", "hosts")
    }
    return {"summary": summary, **tables}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--mounts", type=int, default=4)
    parser.add_argument("--days", type=int, default=30, help="days of history before the new one")
    parser.add_argument("--files", type=int, default=8, help="files per day")
    parser.add_argument(
        "--interval-minutes", type=int, default=1, help="minutes between snapshots of a disk"
    )
    parser.add_argument("--data", type=Path, help="generate into (or reuse) this directory")
    parser.add_argument("--masters", default="local,standalone")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--worker-cores", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--worker-memory", default="12g")
    parser.add_argument("--executor-memory", default="8g")
    parser.add_argument("--keep", action="store_true", help="keep the data and summaries")
    parser.add_argument(
        "--baseline", help="git ref whose job also runs each incremental run (e.g. main)"
    )
    parser.add_argument(
        "--results", type=Path, default=Path(__file__).parent / "results" / "incremental.json"
    )
    args = parser.parse_args()
    fleet._become_subreaper()
    work = Path(tempfile.mkdtemp(prefix="diskguard-bench-incremental-"))
    data = args.data or work / "data"
    masters = [m for m in args.masters.split(",") if m]
    sys.path.insert(0, str(REPO / "tests"))
    from support.sparkcluster import standalone, submit

    try:
        generate(data, args.hosts, args.mounts, args.days, args.files, args.interval_minutes)
        size = sum(p.stat().st_size for p in data.glob("*-*/*.jsonl.gz"))
        # The local JVMs' class archive in a cache of the bench's own: other venvs' runs
        # on this machine replace the archive in ~/.cache with theirs (one per install),
        # and a run that finds none makes it (seconds more, once): made here first.
        cache = dict(XDG_CACHE_HOME=str(data / "jvm-cache"))
        local_env = dict(os.environ, PYTHONPATH=str(REPO / "daemon"), **cache)
        cli = [sys.executable, "-m", "diskguard", "aggregate"]
        # a real run (the first file of the new day, into summaries of its own): a JVM
        # archives the classes it loaded, and a bare session loads half of a run's
        warm, first = work / "warm-up", sorted(data.glob("new-*/*.jsonl.gz"))[0]
        run(
            cli,
            local_env,
            [
                *("--input", str(first), "--output", str(warm / "out")),
                "--summaries",
                str(warm / "s"),
            ],
        )
        summaries = data / f"summaries-{args.days}d"
        result: dict[str, Any] = {
            "hosts": args.hosts,
            "disks": args.hosts * args.mounts,
            "interval_minutes": args.interval_minutes,
            "rows_per_day": args.hosts * args.mounts * (1440 // args.interval_minutes),
            "history_days": args.days,
            "input_gzip_bytes": size,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "target_ratio": TARGET_RATIO,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        baseline = fleet.baseline_tree(args.baseline, work / "baseline") if args.baseline else None
        result["baseline_ref"] = args.baseline
        history = str(data / "day-*" / "*.jsonl.gz")
        if not (summaries / "_manifest").is_dir():
            # one fold of the whole history (what a full recompute costs, keeping summaries)
            fold = run(
                cli,
                local_env,
                [
                    *("--input", history, "--output", str(work / "fold-out")),
                    *("--summaries", str(summaries)),
                ],
            )
            print(f"fold of {args.days} days of history: {fold['seconds']} s", flush=True)
            result["history_fold"] = fold
        for master in masters:
            with contextlib.ExitStack() as stack:
                jobs: dict[str, tuple[list[str], dict[str, str]]] = {}
                for name, daemon in (("current", REPO / "daemon"), ("baseline", baseline)):
                    if daemon is None:
                        continue
                    if master == "standalone":
                        if not jobs:
                            cluster = stack.enter_context(
                                standalone(work, args.worker_cores, args.worker_memory, 300.0)
                            )
                        tmp = work / f"submit-{name}"
                        tmp.mkdir(exist_ok=True)
                        cores, memory = args.worker_cores, args.executor_memory
                        jobs[name] = (
                            submit(cluster, tmp, cores, memory, "4g", daemon=daemon),
                            cluster.env,
                        )
                    else:
                        jobs[name] = (cli, dict(os.environ, PYTHONPATH=str(daemon), **cache))
                result[master] = measure(master, jobs, args, summaries, work, data)
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(result, indent=2) + "\n")
        print(f"-> {args.results}")
        return 0
    finally:
        if args.keep:
            print(f"kept {work} and {data}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def measure(
    master: str,
    jobs: dict[str, tuple[list[str], dict[str, str]]],
    args: argparse.Namespace,
    summaries: Path,
    work: Path,
    data: Path,
) -> dict[str, Any]:
    """Alternating incremental and full runs on one master; best of each and their ratio.

    ``jobs``: the command and environment of this tree's job ("current") and, with
    ``--baseline``, of the baseline's, which runs the incremental run only (right after
    this tree's, on its own fresh copy of the summaries): its report is compared too.
    """
    new_day = str(data / "new-*" / "*.jsonl.gz")
    every_day = str(data / "*-*" / "*.jsonl.gz")
    runs: dict[str, list[dict[str, Any]]] = {"incremental": [], "full": []}
    if "baseline" in jobs:
        runs["baseline_incremental"] = []
    command, env = jobs["current"]
    for i in range(args.repeat):
        incs: dict[str, tuple[dict[str, Any], Path]] = {}
        for name, (job, job_env) in jobs.items():
            copy = work / f"summaries-{master}-{name}-{i}"
            shutil.copytree(summaries, copy)
            out = work / f"inc-{master}-{name}-{i}"
            inc = run(
                job, job_env, ["--input", new_day, "--output", str(out), "--summaries", str(copy)]
            )
            _say(f"{master} incremental run {i + 1} ({name})", inc)
            incs[name] = (inc, out)
            shutil.rmtree(copy)
        full_out = work / f"full-{master}-{i}"
        full = run(command, env, ["--input", every_day, "--output", str(full_out)])
        _say(f"{master} full recompute {i + 1}", full)
        for name, (inc, out) in incs.items():
            inc["same_report_as_full"] = comparable(out) == comparable(full_out)
            print(f"{master} ({name}): same report: {inc['same_report_as_full']}", flush=True)
            runs["incremental" if name == "current" else "baseline_incremental"].append(inc)
        runs["full"].append(full)
    best_inc = min(r["seconds"] for r in runs["incremental"])
    best_full = min(r["seconds"] for r in runs["full"])
    ratio = round(best_inc / best_full, 4)
    print(f"{master}: incremental {best_inc} s vs full {best_full} s: {ratio}", flush=True)
    found: dict[str, Any] = {}
    if "baseline" in jobs:
        best_base = min(r["seconds"] for r in runs["baseline_incremental"])
        found["baseline_incremental_best_seconds"] = best_base
        found["baseline_ratio"] = round(best_base / best_full, 4)
        print(f"{master}: baseline's incremental {best_base} s: {found['baseline_ratio']}")
    return {
        **found,
        "runs": runs,
        "incremental_best_seconds": best_inc,
        "full_best_seconds": best_full,
        "ratio": ratio,
        "cpu_ratio": round(
            min(r["cpu_seconds"] for r in runs["incremental"])
            / min(r["cpu_seconds"] for r in runs["full"]),
            4,
        ),
        "same_report": all(
            r["same_report_as_full"] for name in runs if name != "full" for r in runs[name]
        ),
    }


if __name__ == "__main__":
    sys.exit(main())
