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
through every run, its CPU seconds (a cgroup of the bench's own: the driver, its JVM and
Python workers, a standalone worker's executors) and the other users' CPU beside it are
recorded: the machine is shared. Writes ``bench/results/incremental.json``.

At a snapshot a minute a full recompute takes most of an hour on two cores: ``--phase``
measures in steps, each saved under ``DATA/phases`` and never redone (see ``run_phase``),
against a full recompute of the same 30 days (the run that summarises them from nothing) and
optionally of all 31; ``--pauses`` subtracts the times the runs were frozen (a quiet window
of another bench) from their wall time. Not part of the test suite::

    .venv/bin/python bench/bench_incremental.py --data /var/tmp/fleet31 --keep
    .venv/bin/python bench/bench_incremental.py --hosts 50 --days 5   # a quick check
    .venv/bin/python bench/bench_incremental.py --data /var/tmp/fleet31 --phase full30-local \
        --phase inc-local --results bench/results/incremental-1m.json
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


class CpuMeter:
    """The CPU time of everything this bench starts, standalone executors included.

    The bench moves itself into a cgroup of its own (v2, or v1's ``cpuacct``), which its
    children and their children inherit: a standalone worker's executors are the worker's
    children, never the bench's, so ``RUSAGE_CHILDREN`` missed them. The cgroup's usage
    around a job is the whole job's CPU (the idle master and worker beside it count too,
    a fraction of a second). Without a writable cgroup (not root, no cgroupfs) the children's
    rusage is the fallback and the figure says so (``cpu_source``).
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self.home: Path | None = None
        name = f"diskguard-bench-{os.getpid()}"
        for root, kind in (
            (Path("/sys/fs/cgroup"), "v2"),
            (Path("/sys/fs/cgroup/unified"), "v2"),
            (Path("/sys/fs/cgroup/cpuacct"), "v1"),
        ):
            if kind == "v2" and not (root / "cgroup.procs").exists():
                continue
            if kind == "v1" and not (root / "cpuacct.usage").exists():
                continue
            try:
                home = root / self._current(kind)
                (root / name).mkdir()
                (root / name / "cgroup.procs").write_text(f"{os.getpid()}\n")
            except OSError:
                continue
            self.path, self.home, self.kind = root / name, home, kind
            return
        self.kind = "rusage"

    @staticmethod
    def _current(kind: str) -> str:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (kind == "v2" and controllers == "") or (
                kind == "v1" and "cpuacct" in controllers.split(",")
            ):
                return path.lstrip("/")
        return ""

    def seconds(self) -> float:
        if self.path is None:
            return fleet._children_cpu()
        if self.kind == "v1":
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    def close(self) -> None:
        """Back to the cgroup the bench came from; this one removed once it is empty."""
        if self.path is None or self.home is None:
            return
        with contextlib.suppress(OSError):
            (self.home / "cgroup.procs").write_text(f"{os.getpid()}\n")
            self.path.rmdir()


METER: CpuMeter | None = None


def _machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (``/proc/stat``): the other
    users' share of a run is this minus the run's own."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def paused_seconds(pauses: Path | None, start: float, end: float) -> float:
    """How much of ``start``..``end`` (epoch seconds) the runs were frozen for a quiet
    window of others: ``pauses`` holds one JSON object a line, ``{"start": t, "end": t}``
    (``end`` missing while a pause lasts), written by whoever froze them."""
    if pauses is None or not pauses.exists():
        return 0.0
    total = 0.0
    for line in pauses.read_text().splitlines():
        if line.strip():
            p = json.loads(line)
            total += max(0.0, min(end, p.get("end", end)) - max(start, p["start"]))
    return total


def run(
    command: list[str],
    env: dict[str, str],
    args: list[str],
    pauses: Path | None = None,
    log: Path | None = None,
) -> dict[str, Any]:
    """One aggregate run: wall and CPU seconds (driver, JVMs, Python workers, executors),
    the machine's load through it and the other users' CPU beside it."""
    meter = METER or CpuMeter()
    load_before = os.getloadavg()[0]
    cpu_before = meter.seconds()
    busy_before = _machine_busy_seconds()
    wall_start = time.time()
    started = time.monotonic()
    loads = []
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command + args, stdout=out, stderr=err, env=env)
        while True:
            try:
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                loads.append(os.getloadavg()[0])
        elapsed = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if log is not None:  # all of it: a run that fails after an hour says why
        log.write_text(stdout + stderr)
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
        raise RuntimeError(f"aggregate exited {proc.returncode}: {stderr[-3000:]}")
    cpu = meter.seconds() - cpu_before
    paused = paused_seconds(pauses, wall_start, time.time())
    return {
        "seconds": round(elapsed - paused, 1),
        "paused_seconds": round(paused, 1),
        "cpu_seconds": round(cpu, 1),
        "cpu_source": meter.kind if meter.path else "rusage",
        "others_cpu_seconds": round(_machine_busy_seconds() - busy_before - cpu, 1),
        "load1_before": round(load_before, 2),
        "load1_after": round(os.getloadavg()[0], 2),
        "load1_mean": round(sum(loads) / len(loads), 2) if loads else None,
        "load1_max": round(max(loads), 2) if loads else None,
        "started_at": time.strftime("%H:%M:%S", time.gmtime(wall_start)),
        "stdout": stdout.splitlines()[:2],
    }


def _say(what: str, r: dict[str, Any]) -> None:
    print(
        f"{what}: {r['seconds']} s, CPU {r['cpu_seconds']} s"
        f" (load {r['load1_before']} -> {r['load1_after']}"
        f", others' CPU {r.get('others_cpu_seconds')} s, paused {r.get('paused_seconds', 0)} s)",
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


PHASES = ("full30-local", "inc-local", "inc-standalone", "full30-standalone", "full31-local")


def _commit() -> dict[str, Any]:
    """The commit whose job ran, and whether ``daemon/`` differed from it."""
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "daemon"], capture_output=True, text=True
    ).stdout.strip()
    return {"commit": head, "daemon_modified": bool(dirty)}


def run_phase(
    name: str,
    args: argparse.Namespace,
    data: Path,
    work: Path,
    local: tuple[list[str], dict[str, str]],
) -> None:
    """One run of the measurement in steps (``--phase``), saved to ``data/phases/NAME.json``
    with its output beside it, and never run again once saved: at a snapshot a minute a full
    recompute takes most of an hour on two cores, so each step is its own invocation.

    ``full30-*``: days 1-30 summarised from nothing (the full recompute of those 30 days;
    ``full30-local`` keeps its summaries for the ``inc-*`` steps); ``inc-*``: the new day
    onto a fresh copy of them; ``full31-local``: all 31 days, no summaries, as the default
    mode's full recompute.
    """
    store = data / "phases"
    store.mkdir(exist_ok=True)
    if (store / f"{name}.json").exists():
        print(f"{name}: already measured ({store / f'{name}.json'})", flush=True)
        return
    # Two invocations may run side by side (a standalone and a local step): never the same one.
    running = store / f"{name}.running"
    with contextlib.suppress(FileNotFoundError, ValueError):
        other = int(running.read_text())
        if Path(f"/proc/{other}").exists():
            print(f"{name}: being measured by pid {other}", flush=True)
            return
    running.write_text(f"{os.getpid()}\n")
    try:
        _measure_phase(name, args, data, work, local, store)
    finally:
        running.unlink(missing_ok=True)


def _measure_phase(
    name: str,
    args: argparse.Namespace,
    data: Path,
    work: Path,
    local: tuple[list[str], dict[str, str]],
    store: Path,
) -> None:
    from support.sparkcluster import standalone, submit

    kind, master = name.split("-")
    out = store / f"{name}-out"
    shutil.rmtree(out, ignore_errors=True)
    summaries = data / f"summaries-{args.days}d"
    inputs = {"full30": "day-*", "inc": "new-*", "full31": "*-*"}[kind]
    argv = ["--input", str(data / inputs / "*.jsonl.gz"), "--output", str(out)]
    if kind == "full30":
        target = summaries if master == "local" else work / "summaries-standalone"
        shutil.rmtree(target, ignore_errors=True)  # what a run cut short left
        argv += ["--summaries", str(target)]
    elif kind == "inc":
        if not (store / "full30-local.json").exists():  # its summaries complete
            raise SystemExit(f"{summaries}: no summaries yet (run --phase full30-local first)")
        copy = work / f"summaries-{name}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(summaries, copy)
        argv += ["--summaries", str(copy)]
    with contextlib.ExitStack() as stack:
        if master == "standalone":
            cluster = stack.enter_context(
                standalone(work, args.worker_cores, args.worker_memory, 300.0)
            )
            tmp = work / "submit"
            tmp.mkdir(exist_ok=True)
            command = submit(cluster, tmp, args.worker_cores, args.executor_memory, "4g")
            env = cluster.env
        else:
            command, env = local
        result = run(command, env, argv, args.pauses, store / f"{name}.log")
    _say(name, result)
    result.update(_commit(), phase=name, master=master, input=inputs)
    (store / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")


def phase_results(data: Path) -> dict[str, Any]:
    """The steps measured so far, their ratios, and which reports are the same."""
    store = data / "phases"
    found = {
        name: json.loads((store / f"{name}.json").read_text())
        for name in PHASES
        if (store / f"{name}.json").exists()
    }
    found = {name: r for name, r in found.items() if "seconds" in r}
    result: dict[str, Any] = {"phases": found}
    for master in ("local", "standalone"):
        inc, full = found.get(f"inc-{master}"), found.get(f"full30-{master}")
        if inc and full:
            result[f"{master}_ratio"] = round(inc["seconds"] / full["seconds"], 4)
            result[f"{master}_cpu_ratio"] = round(inc["cpu_seconds"] / full["cpu_seconds"], 4)
    if "inc-local" in found and "full31-local" in found:
        result["local_ratio_vs_full31"] = round(
            found["inc-local"]["seconds"] / found["full31-local"]["seconds"], 4
        )
        result["local_cpu_ratio_vs_full31"] = round(
            found["inc-local"]["cpu_seconds"] / found["full31-local"]["cpu_seconds"], 4
        )
    same = {}
    for a, b in (
        ("inc-local", "full31-local"),
        ("inc-standalone", "full31-local"),
        ("inc-standalone", "inc-local"),
        ("full30-standalone", "full30-local"),
    ):
        if a in found and b in found:
            same[f"{a} = {b}"] = comparable(store / f"{a}-out") == comparable(store / f"{b}-out")
    result["same_report"] = same
    return result


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
    parser.add_argument(
        "--phase",
        action="append",
        choices=PHASES,
        help="measure in steps saved under DATA/phases instead (repeatable; see run_phase)",
    )
    parser.add_argument(
        "--generate-only", action="store_true", help="write the fleet's files and stop"
    )
    parser.add_argument(
        "--pauses",
        type=Path,
        help="JSON lines of {start, end} (epoch s) when the runs were frozen: not wall time",
    )
    args = parser.parse_args()
    global METER
    METER = CpuMeter()
    fleet._become_subreaper()
    work = Path(tempfile.mkdtemp(prefix="diskguard-bench-incremental-"))
    data = args.data or work / "data"
    masters = [m for m in args.masters.split(",") if m]
    sys.path.insert(0, str(REPO / "tests"))
    from support.sparkcluster import standalone, submit

    try:
        generate(data, args.hosts, args.mounts, args.days, args.files, args.interval_minutes)
        if args.generate_only:
            return 0
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
        local_phases = [p for p in args.phase or () if p.endswith("-local")]
        if not args.phase or (local_phases and not (data / "jvm-cache").exists()):
            run(
                cli,
                local_env,
                [
                    *("--input", str(first), "--output", str(warm / "out")),
                    "--summaries",
                    str(warm / "s"),
                ],
            )
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
        if args.phase:
            for name in args.phase:
                run_phase(name, args, data, work, (cli, local_env))
            found = {**result, **phase_results(data)}
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps(found, indent=2) + "\n")
            print(json.dumps({k: v for k, v in found.items() if k != "phases"}, indent=2))
            print(f"-> {args.results}")
            return 0
        summaries = data / f"summaries-{args.days}d"
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
        METER.close()
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
