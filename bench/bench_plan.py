"""Cold ``diskguard plan`` against cold ``du -s`` on the same 3M-file tree.

Issue contract: over 1,000 partitions x 1,000 segments (3M files) a cold ``diskguard plan``
must take less wall time than ``du -s`` of the same tree, measured in the same run, with a
peak RSS under 200 MB.

The tree lives on a loop-mounted ext4 image of its own (``gen_tree.py`` writes it). The plan's
config puts ``retention.disk_usage_percent`` just below the filesystem's current usage so the
plan really has to choose segments (``--choose``, a few thousand), globally oldest first.
Before every timed command: ``sync`` and ``echo 3 > /proc/sys/vm/drop_caches`` (cold). The two
commands alternate ``--runs`` times; medians are reported. Peak RSS comes from GNU time
(``%M``). The plan's output is checked: chosen segments must be exactly the
globally oldest prefix set, so the timing is of real work.

Writes ``bench/results/plan.json``. ``--partitions 100 --segments 100`` is a one-minute smoke run.

``--warm`` (issue 15): the tree on a tmpfs of its own (everything in memory, nothing to drop),
``--choose`` about 10 % of the closed segments; ``du -s`` and ``plan --json`` alternate
``--runs`` times after one untimed run of each, medians and the ratio are reported and written
to ``bench/results/plan-warm-<partitions>x<segments>.json``. ``--scaling`` runs the warm
scenario at 10k, 100k and 1M segments (1,000 partitions) for the scaling table.
``--baseline REV`` (with ``--warm``/``--scaling``) times commit REV's plan in the same
alternation (exported with ``git archive``), both plans as ``python -m diskguard``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_tree
import loopfs
from machine import RESULTS, ROOT, machine_info

DISKGUARD = Path(os.environ.get("DISKGUARD_BIN", ROOT / ".venv" / "bin" / "diskguard"))
RSS_LIMIT_MB = 200.0
TIME = "/usr/bin/time"


@dataclass(frozen=True)
class Run:
    command: str
    wall_s: float
    max_rss_mb: float
    returncode: int
    cold: bool
    #: User + system CPU seconds (GNU time): steadier than wall time on a shared machine.
    #: The command's own process and the children it waited for only.
    cpu_s: float = 0.0
    #: CPU seconds of every process of the command (``CpuGroup``), a worker it killed
    #: rather than waited for included; None where no cgroup could be made.
    all_cpu_s: float | None = None


class CpuGroup:
    """A cgroup (v1 ``cpuacct``) of its own for the timed commands: the CPU time of every
    process a command started, including a worker it killed rather than waited for (GNU
    time counts only the children waited for). Absent where none can be made."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self) -> None:
        self.path: Path | None = self.ROOT / f"diskguard-bench-{os.getpid()}"
        try:
            self.path.mkdir()
        except OSError:
            self.path = None

    def usage_s(self) -> float | None:
        if self.path is None:
            return None
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def enter(self) -> None:
        """In the child before ``exec``: it and all it starts are counted."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def close(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.rmdir()
            self.path = None


def timed(
    cmd: list[str],
    stdout: Any,
    stderr: Any,
    cold: bool,
    env: dict[str, str] | None = None,
    group: CpuGroup | None = None,
) -> Run:
    """Wall time, CPU time and peak RSS of one command (``group``: and the CPU time of all
    its processes).

    RSS comes from GNU time (``%M``), a tiny parent: a child forked from this Python process
    would report this process's RSS as its own peak (Linux keeps the pre-exec high-water mark).
    """
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        before = group.usage_s() if group is not None else None
        started = time.perf_counter()
        proc = subprocess.run(
            [TIME, "-f", "%M %U %S", "-o", tf.name, *cmd],
            stdout=stdout,
            stderr=stderr,
            check=False,
            env=env,
            preexec_fn=group.enter if group is not None else None,
        )
        wall = time.perf_counter() - started
        if before is not None and group is not None:
            # A killed worker's last moments: until every process of the group has gone.
            deadline = time.monotonic() + 5
            while (
                group.path is not None
                and (group.path / "cgroup.procs").read_text().strip()
                and time.monotonic() < deadline
            ):
                time.sleep(0.005)
        after = group.usage_s() if group is not None else None
        lines = [ln for ln in tf.read().splitlines() if ln.strip()]
    fields = lines[-1].split() if lines else []
    rss_kb = int(fields[0]) if len(fields) == 3 and fields[0].isdigit() else 0
    cpu = float(fields[1]) + float(fields[2]) if len(fields) == 3 and rss_kb else 0.0
    return Run(
        command=os.path.basename(cmd[0]),
        wall_s=wall,
        max_rss_mb=rss_kb / 1024.0,
        returncode=proc.returncode,
        cold=cold,
        cpu_s=cpu,
        all_cpu_s=None if before is None or after is None else after - before,
    )


def segment_bytes(tree: Path) -> int:
    """Allocated bytes of one closed segment (all closed segments are alike)."""
    part = next(p for p in sorted(tree.iterdir()) if p.is_dir())
    stem = f"{0:020d}"
    return sum(
        os.stat(part / f"{stem}{sfx}").st_blocks * 512 for sfx in (".log", ".index", ".timeindex")
    )


def write_config(
    path: Path, tree: Path, limit_percent: float, state_dir: Path, bootstrap: str | None = None
) -> None:
    """Offline (auto mode, no broker: every topic assumed ``delete``), or with ``bootstrap``
    auto mode with a broker up: broker mode, the policies asked of the broker."""
    broker = f'bootstrap_servers = "{bootstrap}"\n' if bootstrap else ""
    assume = "" if bootstrap else 'assume_delete_policy = [".*"]\n'
    path.write_text(
        "[broker]\n"
        f'log_dirs = ["{tree}"]\n{broker}\n'
        "[retention]\n"
        f"disk_usage_percent = {limit_percent!r}\n"
        'mode = "auto"\n'
        "offline_headroom = 0\n"
        f"{assume}\n"
        "[daemon]\n"
        f'state_dir = "{state_dir}"\n\n'
        "[logging]\n"
        'level = "warning"\n'
    )


@contextlib.contextmanager
def broker_for(parts: int) -> Iterator[str]:
    """A real Kafka broker (the project's harness, the newest 4.x or ``DISKGUARD_KAFKA_*``)
    that knows the tree's topics (``gen_tree``'s names and partition counts; its log dir is
    its own, not the tree) and a consumer group that has read half of them up to the middle
    of each partition: a plan in broker mode asks it for the policies, the group's offsets
    and the leaders. Yields its bootstrap address."""
    sys.path.insert(0, str(ROOT / "tests"))
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import NewTopic

    from support.kafka import target
    from support.kafka.cluster import running_broker

    kafka = target()
    log_dir = Path(tempfile.mkdtemp(prefix="diskguard-bench-plan-broker-")) / "kafka-logs"
    topics: dict[str, int] = {}
    for p in range(parts):
        topic, partition = gen_tree.partition_name(p, parts)
        topics[topic] = max(topics.get(topic, 0), partition + 1)
    with (
        contextlib.ExitStack() as cleanup,
        running_broker(kafka.release, kafka.classpath, log_dir, mode=kafka.mode) as broker,
    ):
        cleanup.callback(shutil.rmtree, log_dir.parent, True)  # once the broker has stopped
        admin = broker.admin()
        new = [NewTopic(t, num_partitions=n, replication_factor=1) for t, n in topics.items()]
        for future in admin.create_topics(new, request_timeout=120).values():
            future.result(180)
        for topic, n in topics.items():
            broker._wait_leaders(admin, topic, n, timeout=120)
        group = Consumer({**broker.client_config(), "group.id": "bench-plan-readers"})
        try:
            middle = gen_tree.RECORDS_PER_SEGMENT * 50
            offsets = [
                TopicPartition(t, p, middle)
                for t, n in sorted(topics.items())[::2]
                for p in range(n)
            ]
            group.commit(offsets=offsets, asynchronous=False)
        finally:
            group.close()
        print(f"broker {kafka}: {len(topics)} topics, {parts} partitions", flush=True)
        yield broker.bootstrap


def verify_plan(
    output: dict[str, Any], partitions: int, segments: int, want: int
) -> dict[str, Any]:
    """The chosen set must be a per-partition prefix and exactly the globally oldest segments."""
    chosen: dict[tuple[str, int], list[int]] = {}
    for d in output["deletions"]:
        chosen.setdefault((d["topic"], d["partition"]), []).append(d["base_offset"])
    records = gen_tree.RECORDS_PER_SEGMENT
    newest_chosen = max((d["max_timestamp_ms"] for d in output["deletions"]), default=None)
    oldest_left: int | None = None
    problems: list[str] = []
    for p in range(partitions):
        name = gen_tree.partition_name(p, partitions)
        bases = sorted(chosen.get(name, []))
        k = len(bases)
        if bases != [s * records for s in range(k)]:
            problems.append(f"{name}: chosen {bases[:5]}... is not a prefix")
        if k < segments - 1:
            ts = gen_tree.segment_timestamp(p, k, segments)
            oldest_left = ts if oldest_left is None else min(oldest_left, ts)
    if newest_chosen is not None and oldest_left is not None and newest_chosen > oldest_left:
        problems.append(f"a segment of age {oldest_left} was left while {newest_chosen} was chosen")
    stamps = [d["max_timestamp_ms"] for d in output["deletions"]]
    if stamps != sorted(stamps):
        problems.append("deletions are not in oldest-first order")
    count = len(output["deletions"])
    if abs(count - want) > max(2, want // 100):
        problems.append(f"chose {count} segments, expected about {want}")
    return {"chosen_segments": count, "ok": not problems, "problems": problems[:10]}


def profile_plan(config: Path, out: Path, cold: bool) -> str:
    """cProfile one plan in-process-like (a child running the real CLI entry point)."""
    prof = out.with_suffix(".prof")
    script = (
        "import sys\nfrom diskguard.cli import main\n"
        f"sys.argv = ['diskguard', 'plan', '-c', {str(config)!r}, '--json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(script)
    if cold:
        loopfs.drop_caches()
    subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-m", "cProfile", "-o", str(prof), fh.name],
        stdout=subprocess.DEVNULL,
        check=False,
    )
    os.unlink(fh.name)
    buf = io.StringIO()
    stats = pstats.Stats(str(prof), stream=buf)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(20)
    text = buf.getvalue()
    out.write_text(text)
    return text


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    parts, segs = args.partitions, args.segments
    image_dir = Path(args.image_dir)
    image = image_dir / f"plan-{parts}x{segs}.img"
    mnt = image_dir / f"plan-{parts}x{segs}.mnt"
    n_segments = parts * segs
    size = max(1 << 30, n_segments * 40 * 1024)  # 40 GiB for 1M segments: ~25% used
    inodes = max(65536, n_segments * 4 + parts * 4)
    marker_want = {"partitions": parts, "segments": segs, "generator": 2}
    result: dict[str, Any] = {"benchmark": "plan", "partitions": parts, "segments": segs}
    with loopfs.loop_fs(image, mnt, size, inodes, reuse=args.keep, keep=args.keep) as reused:
        tree = mnt / "kafka-logs"
        marker = mnt / "bench-tree.json"
        have = json.loads(marker.read_text()) if marker.exists() else None
        if not (reused and have and {k: have.get(k) for k in marker_want} == marker_want):
            if reused:
                print("cached image does not hold this tree; making a new one", flush=True)
                loopfs.umount(mnt)
                loopfs.make_image(image, size, inodes)
                loopfs.mount(image, mnt)
            print(f"generating {parts} x {segs} segments ({n_segments * 3:,} files)...", flush=True)
            gen_s = gen_tree.generate(str(tree), parts, segs, workers=args.workers)
            os.sync()
            marker.write_text(json.dumps({**marker_want, "generate_s": round(gen_s, 1)}))
            print(f"  generated in {gen_s:.1f} s", flush=True)
            have = json.loads(marker.read_text())
        result["generate_s"] = have.get("generate_s")
        result["tree_reused"] = bool(reused)

        per_segment = segment_bytes(tree)
        used, avail, pct = loopfs.statvfs_usage(mnt)
        excess = int((args.choose - 0.5) * per_segment)
        limit = 100.0 * (used - excess) / (used + avail)
        result.update(
            filesystem={
                "size_bytes": used + avail,
                "used_bytes": used,
                "usage_percent": round(pct, 4),
                "inodes": inodes,
            },
            limit_percent=limit,
            segment_bytes=per_segment,
            files=n_segments * 3,
        )
        work = Path(tempfile.mkdtemp(prefix="diskguard-bench-plan-"))
        config = work / "diskguard.toml"
        write_config(config, tree, limit, work / "state")
        plan_out = work / "plan.json"
        plan_err = work / "plan.err"
        du_cmd = ["du", "-s", str(tree)]
        plan_cmd = [str(DISKGUARD), "plan", "-c", str(config), "--json"]

        cold_note = loopfs.drop_caches()
        cold = cold_note is None
        if not cold:
            print(f"WARNING: {cold_note}: numbers below are WARM (cached)", flush=True)
        runs: list[Run] = []
        du_kb: str | None = None
        for i in range(args.runs):
            order = ("du", "plan") if i % 2 == 0 else ("plan", "du")
            for which in order:
                if cold:
                    loopfs.drop_caches()
                if which == "du":
                    with open(work / "du.out", "w") as out:
                        r = timed(du_cmd, out, subprocess.DEVNULL, cold)
                    du_kb = (work / "du.out").read_text().split()[0]
                else:
                    with open(plan_out, "w") as out, open(plan_err, "w") as err:
                        r = timed(plan_cmd, out, err, cold)
                runs.append(r)
                print(
                    f"  run {i + 1} {which:4}: {r.wall_s:7.2f} s  rss {r.max_rss_mb:6.1f} MB"
                    f"  rc={r.returncode}",
                    flush=True,
                )
                if which == "plan" and r.returncode != 0:
                    err_text = plan_err.read_text()[-3000:]
                    result["plan_error"] = err_text
                    print(f"plan FAILED (rc={r.returncode}):\n{err_text}", flush=True)
                    result["runs"] = [asdict(x) for x in runs]
                    return result
        # Warm, for reference: each command twice in a row without dropping; the second counts.
        for _ in range(2):
            with open(work / "du.out", "w") as out:
                warm_du = timed(du_cmd, out, subprocess.DEVNULL, False)
        for _ in range(2):
            with open(plan_out, "w") as out, open(plan_err, "w") as err:
                warm_plan = timed(plan_cmd, out, err, False)

        output = json.loads(plan_out.read_text())
        check = verify_plan(output, parts, segs, args.choose)
        du_walls = [r.wall_s for r in runs if r.command == "du"]
        plan_walls = [r.wall_s for r in runs if r.command != "du"]
        plan_rss = max(r.max_rss_mb for r in runs if r.command != "du")
        du_med, plan_med = median(du_walls), median(plan_walls)
        result.update(
            cold=cold,
            cold_note=cold_note,
            runs=[asdict(r) for r in runs],
            du_kib=int(du_kb) if du_kb else None,
            du_median_s=round(du_med, 3),
            plan_median_s=round(plan_med, 3),
            ratio_plan_over_du=round(plan_med / du_med, 3),
            plan_peak_rss_mb=round(plan_rss, 1),
            warm={"du_s": round(warm_du.wall_s, 3), "plan_s": round(warm_plan.wall_s, 3)},
            plan_check=check,
            plan_stderr=plan_err.read_text()[-2000:],
            targets={
                "plan_faster_than_du": plan_med < du_med,
                f"rss_under_{RSS_LIMIT_MB:g}_mb": plan_rss < RSS_LIMIT_MB,
            },
        )
        if args.profile:
            prof_txt = RESULTS / "plan-profile.txt"
            profile_plan(config, prof_txt, cold)
            result["profile"] = str(prof_txt.relative_to(ROOT))
    return result


def print_table(r: dict[str, Any]) -> None:
    if "du_median_s" not in r:
        return
    mode = "cold" if r["cold"] else "WARM (could not drop caches)"
    print()
    print(
        f"plan vs du, {r['partitions']} x {r['segments']} segments = {r['files']:,} files ({mode})"
    )
    print(f"{'':16}{'median wall':>12}{'peak RSS':>12}{'warm wall':>12}")
    du_rss = max(x["max_rss_mb"] for x in r["runs"] if x["command"] == "du")
    print(f"{'du -s':16}{r['du_median_s']:>11.2f}s{du_rss:>10.1f}MB{r['warm']['du_s']:>11.2f}s")
    print(
        f"{'diskguard plan':16}{r['plan_median_s']:>11.2f}s{r['plan_peak_rss_mb']:>10.1f}MB"
        f"{r['warm']['plan_s']:>11.2f}s"
    )
    print(f"ratio plan/du = {r['ratio_plan_over_du']:.3f}   (target < 1; RSS target < 200 MB)")
    check = r["plan_check"]
    print(f"plan chose {check['chosen_segments']} segments; globally-oldest check ok={check['ok']}")
    for p in check["problems"]:
        print(f"  problem: {p}")


def checkout_plan(rev: str | None, into: Path) -> tuple[list[str], dict[str, str]]:
    """``plan`` of this checkout's ``daemon/`` (``rev`` None) or of commit ``rev`` exported
    with ``git archive`` into ``into``: ``python -m diskguard`` on this interpreter and its
    libraries, byte-compiled first (an installed package has byte-code), so a baseline and
    this code start the same way."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    daemon = ROOT / "daemon"
    if rev is not None:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "daemon"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
        daemon = into / "daemon"
    env["PYTHONPATH"] = str(daemon)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(daemon)], env=env, check=True)
    return [sys.executable, "-m", "diskguard", "plan"], env


def warm_run(
    parts: int,
    segs: int,
    n_runs: int,
    choose: int | None,
    workers: int,
    baseline: str | None = None,
    broker: bool = False,
) -> dict[str, Any]:
    """Warm plan vs warm du on a tmpfs of its own (issue 15's scenario); ``broker``: with a
    real broker up and ``bootstrap_servers`` set (broker mode, ``broker_for``).

    With ``baseline``: that commit's plan runs too, in the same alternation (du, plan,
    baseline; reversed every other round), and both plans run as ``python -m diskguard``
    (``checkout_plan``); without, the installed ``diskguard`` script is timed.
    """
    n_segments = parts * segs
    want = choose if choose is not None else max(1, n_segments // 10)
    mnt = Path(tempfile.mkdtemp(prefix="diskguard-bench-plan-warm-"))
    size_mb = max(256, n_segments * 16 // 1024 + 256)  # ~12 KiB a closed segment on tmpfs
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mnt)], check=True
    )
    result: dict[str, Any] = {
        "benchmark": "plan-warm",
        "filesystem": "tmpfs",
        "partitions": parts,
        "segments": segs,
        "files": n_segments * 3,
    }
    stack = contextlib.ExitStack()
    group = CpuGroup()
    stack.callback(group.close)
    try:
        bootstrap = stack.enter_context(broker_for(parts)) if broker else None
        result["broker"] = bootstrap is not None
        tree = mnt / "kafka-logs"
        print(f"warm: generating {parts} x {segs} segments on tmpfs...", flush=True)
        result["generate_s"] = round(gen_tree.generate(str(tree), parts, segs, workers=workers), 1)
        generated_at = time.time()
        per_segment = segment_bytes(tree)
        used, avail, pct = loopfs.statvfs_usage(mnt)
        limit = 100.0 * (used - int((want - 0.5) * per_segment)) / (used + avail)
        work = Path(tempfile.mkdtemp(prefix="diskguard-bench-plan-"))
        config = work / "diskguard.toml"
        # The state dir exists, as on a host where the daemon runs (it makes it): each plan
        # keeps its listings there for the next (``listingstore``). "unkept": the same plan
        # with a state dir that is not there, listing every dir as a first plan does.
        (work / "state").mkdir()
        write_config(config, tree, limit, work / "state", bootstrap)
        unkept = work / "unkept.toml"
        write_config(unkept, tree, limit, work / "no-state", bootstrap)
        plan_args = ["-c", str(config), "--json"]
        commands: dict[str, tuple[list[str], dict[str, str] | None]] = {
            "du": (["du", "-s", str(tree)], None)
        }
        if baseline is None:
            commands["plan"] = ([str(DISKGUARD), "plan", *plan_args], None)
            commands["unkept"] = ([str(DISKGUARD), "plan", "-c", str(unkept), "--json"], None)
        else:
            cmd, env = checkout_plan(None, work)
            commands["plan"] = ([*cmd, *plan_args], env)
            commands["unkept"] = ([*cmd, "-c", str(unkept), "--json"], env)
            cmd, env = checkout_plan(baseline, work)
            commands["baseline"] = ([*cmd, *plan_args], env)
        # One untimed run of each: the dentry/inode caches are warm for all, and the plan has
        # kept its listings. A dir changed within 2 s of a plan's look is not kept
        # (``listingstore.SETTLE_S``): the tree is left to settle first, or the first timed
        # plan lists again what the untimed one could not keep.
        time.sleep(max(0.0, generated_at + 2.5 - time.time()))
        for cmd, env in commands.values():
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        runs: list[Run] = []
        outputs: dict[str, Path] = {}
        for i in range(n_runs):
            order = list(commands) if i % 2 == 0 else list(reversed(commands))
            for which in order:
                cmd, env = commands[which]
                outputs[which] = work / f"{which}.out"
                with open(outputs[which], "w") as out, open(work / f"{which}.err", "w") as err:
                    r = timed(cmd, out, err, False, env=env, group=group)
                runs.append(
                    Run(which, r.wall_s, r.max_rss_mb, r.returncode, False, r.cpu_s, r.all_cpu_s)
                )
                every = "" if r.all_cpu_s is None else f" (all processes {r.all_cpu_s:5.2f} s)"
                print(
                    f"  run {i + 1} {which:8}: {r.wall_s:6.2f} s  cpu {r.cpu_s:6.2f} s{every}"
                    f"  rss {r.max_rss_mb:6.1f} MB"
                )
        du_med = median([r.wall_s for r in runs if r.command == "du"])
        du_cpu = median([r.cpu_s for r in runs if r.command == "du"])
        for which in commands:
            if which == "du":
                continue
            mine = [r for r in runs if r.command == which]
            med = median([r.wall_s for r in mine])
            cpu = median([r.cpu_s for r in mine])
            every = [r.all_cpu_s for r in mine if r.all_cpu_s is not None]
            figures = {
                "plan_median_s": round(med, 3),
                "plan_all_processes_cpu_median_s": round(median(every), 3) if every else None,
                "ratio_plan_over_du": round(med / du_med, 3),
                "plan_cpu_median_s": round(cpu, 3),
                "cpu_ratio_plan_over_du": round(cpu / du_cpu, 3) if du_cpu else None,
                "plan_peak_rss_mb": round(max(r.max_rss_mb for r in mine), 1),
                "plan_check": verify_plan(
                    json.loads(outputs[which].read_text()), parts, segs, want
                ),
            }
            if which == "plan":
                result.update(figures)
            elif which == "unkept":
                result["unkept"] = figures
            else:
                result["baseline"] = {"commit": baseline, **figures}
        result.update(
            usage_percent=round(pct, 3),
            limit_percent=limit,
            runs=[asdict(r) for r in runs],
            du_median_s=round(du_med, 3),
            du_cpu_median_s=round(du_cpu, 3),
            targets={"warm_plan_at_most_du": result["plan_median_s"] <= du_med},
        )
    finally:
        stack.close()
        subprocess.run(["umount", str(mnt)], check=False)
        os.rmdir(mnt)
    return result


def _ratio(value: float | None) -> str:
    """A CPU ratio, or why there is none (a tree so small du used no measurable CPU)."""
    return "n/a (du: 0 s of CPU)" if value is None else f"{value:.2f}"


def _every(figures: dict[str, Any]) -> str:
    every = figures.get("plan_all_processes_cpu_median_s")
    return "" if every is None else f" (all its processes {every:.2f} s)"


def print_warm(r: dict[str, Any]) -> None:
    mode = ", broker up (broker mode)" if r.get("broker") else ""
    print(
        f"warm, tmpfs{mode}, {r['partitions']} x {r['segments']} segments:"
        f" du {r['du_median_s']:.2f} s,"
        f" plan {r['plan_median_s']:.2f} s (rss {r['plan_peak_rss_mb']:.0f} MB),"
        f" ratio plan/du = {r['ratio_plan_over_du']:.2f} (target <= 1);"
        f" chose {r['plan_check']['chosen_segments']}, ok={r['plan_check']['ok']}"
    )
    print(
        f"  CPU (user+sys) medians: du {r['du_cpu_median_s']:.2f} s,"
        f" plan {r['plan_cpu_median_s']:.2f} s, ratio {_ratio(r['cpu_ratio_plan_over_du'])}"
        + _every(r)
    )
    unkept = r.get("unkept")
    if unkept:
        print(
            f"  the same plan, no state dir (no kept listings), same run:"
            f" {unkept['plan_median_s']:.2f} s, ratio plan/du ="
            f" {unkept['ratio_plan_over_du']:.2f}; CPU {unkept['plan_cpu_median_s']:.2f} s"
            f"{_every(unkept)}; ok={unkept['plan_check']['ok']}"
        )
    base = r.get("baseline")
    if base:
        print(
            f"  baseline {base['commit']}, same run: plan {base['plan_median_s']:.2f} s"
            f" (rss {base['plan_peak_rss_mb']:.0f} MB), ratio plan/du ="
            f" {base['ratio_plan_over_du']:.2f}; CPU {base['plan_cpu_median_s']:.2f} s,"
            f" ratio {_ratio(base['cpu_ratio_plan_over_du'])}{_every(base)};"
            f" ok={base['plan_check']['ok']}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--segments", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--choose", type=int, default=3000, help="segments the plan must choose")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--image-dir", default="/var/tmp/diskguard-bench")
    ap.add_argument("--keep", action="store_true", help="keep (and reuse) the image")
    ap.add_argument("--profile", action="store_true", help="cProfile one cold plan")
    ap.add_argument("--out", default=str(RESULTS / "plan.json"))
    ap.add_argument("--warm", action="store_true", help="warm plan vs du on tmpfs (issue 15)")
    ap.add_argument("--scaling", action="store_true", help="--warm at 10k, 100k and 1M segments")
    ap.add_argument(
        "--baseline",
        metavar="REV",
        help="--warm/--scaling: also time commit REV's plan in the same alternation",
    )
    ap.add_argument(
        "--broker",
        action="store_true",
        help="--warm/--scaling: a real Kafka broker up and bootstrap_servers set (broker mode)",
    )
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_plan needs root (loop mounts, drop_caches)", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.warm or args.scaling:
        sizes = (
            [(1000, 10), (1000, 100), (1000, 1000)]
            if args.scaling
            else [(args.partitions, args.segments)]
        )
        choose = None if args.scaling or "--choose" not in (argv or sys.argv) else args.choose
        ok = True
        for parts, segs in sizes:
            r = warm_run(parts, segs, args.runs, choose, args.workers, args.baseline, args.broker)
            r["machine"] = machine_info()
            out = RESULTS / f"plan-warm-{parts}x{segs}{'-broker' if args.broker else ''}.json"
            out.write_text(json.dumps(r, indent=2) + "\n")
            print_warm(r)
            print(f"wrote {out}")
            ok = (
                ok
                and r["plan_check"]["ok"]
                and r.get("baseline", {}).get("plan_check", {}).get("ok", True)
            )
        return 0 if ok else 1
    result = run(args)
    result["machine"] = machine_info()
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {args.out}")
    ok = "du_median_s" in result and result["plan_check"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
