"""Soak: ``diskguard run`` guarding several disks at once while writers roll segments on all
of them, for ``--minutes`` (10 by default; a bench, not a test).

Setup: ``--disks`` loop-mounted ext4 images (``--fs-mib`` each), each with a real-format log
dir (``tests/support/kafkagen.py``); one daemon (offline mode: no broker, nobody holds ``.lock``)
guards them all. One writer process per disk plays the broker (``bench_reaction.writer_main``:
RecordBatch v2 batches with correct CRC32C, sparse preallocated indexes, rolls at
``--segment-mib``) at ``--rate-mib-s``, so every disk crosses its ceiling again and again.

Measured:
- per disk, every episode above ``disk_usage_percent`` (statvfs polled every few ms, no
  debounce): the longest one is the headline ("never over the ceiling longer than 1 s");
- the daemon's RSS (``VmRSS``) and open fds (``/proc/PID/fd``) after warm-up and at the end,
  sampled every 10 s in between (a leak shows as a trend, not as one number);
- writer ENOSPC (a disk that actually filled), daemon errors (``cycle_failed``, ...), and
  that the daemon exits 0 on SIGTERM at the end.

Writes ``bench/results/soak.json`` (``--out``). Run as root: ``python bench/soak.py``
(``--minutes 1`` for a short run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))

import loopfs
from bench_reaction import MIB, DaemonProcess, workdir, writer_main
from machine import RESULTS, machine_info
from support import configs, kafkagen

ERROR_EVENTS = ("cycle_failed", "segment_delete_failed", "usage_read_failed", "offline_refused")


def proc_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def write_config(
    path: Path, log_dirs: list[Path], state_dir: Path, limit: float, target: float
) -> None:
    configs.write_config(
        path.parent,
        log_dirs,
        snapshots={"interval": "10s", "host": "soak"},
        logging={"format": "json", "level": "info"},
        state_dir=state_dir,
        name=path.name,
        disk_usage_percent=limit,
        target_percent=target,
        mode="offline",
        offline_headroom=0,
    )


class Episodes:
    """Time spent above the ceiling, per disk, episode by episode."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.over_since: float | None = None
        self.durations: list[float] = []
        self.peak = 0.0
        self.polls = 0

    def sample(self, pct: float, now: float) -> None:
        self.polls += 1
        self.peak = max(self.peak, pct)
        if pct > self.limit:
            if self.over_since is None:
                self.over_since = now
        elif self.over_since is not None:
            self.durations.append(now - self.over_since)
            self.over_since = None

    def summary(self, now: float) -> dict[str, Any]:
        ongoing = now - self.over_since if self.over_since is not None else 0.0
        worst = max([*self.durations, ongoing], default=0.0)
        ordered = sorted(self.durations)
        return {
            "episodes": len(self.durations),
            "max_over_s": round(worst, 4),
            "p99_over_s": round(ordered[int(0.99 * (len(ordered) - 1))], 4) if ordered else 0,
            "episodes_over_1s": sum(1 for d in self.durations if d > 1.0) + (ongoing > 1.0),
            "peak_usage_percent": round(self.peak, 3),
            "polls": self.polls,
        }


def soak(args: argparse.Namespace) -> dict[str, Any]:
    image_dir = Path(args.image_dir)
    image_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "minutes": args.minutes,
        "disks": args.disks,
        "filesystem_mib": args.fs_mib,
        "limit_percent": args.limit,
        "target_percent": args.target,
        "writer_rate_mib_s_per_disk": args.rate_mib_s,
        "writer_partitions_per_disk": args.partitions,
        "segment_mib": args.segment_mib,
    }
    with contextlib.ExitStack() as stack:
        work = stack.enter_context(workdir("diskguard-soak-"))
        mounts: list[Path] = []
        for i in range(args.disks):
            image, mnt = image_dir / f"soak-{i}.img", image_dir / f"soak-{i}.mnt"
            stack.enter_context(
                loopfs.loop_fs(image, mnt, args.fs_mib * MIB, 65536, reuse=False, keep=False)
            )
            mounts.append(mnt)
        layouts = []
        for mnt in mounts:
            specs = {
                (f"hot-{p % 4}", p // 4): [
                    kafkagen.SegmentSpec(
                        records=1000,
                        payload_size=1000,
                        records_per_batch=50,
                        first_timestamp_ms=kafkagen.DEFAULT_FIRST_TIMESTAMP_MS + k * 3_600_000,
                    )
                    for k in range(3)
                ]
                for p in range(args.partitions)
            }
            layouts.append(kafkagen.write_log_dir(mnt / "kafka-logs", specs))
        os.sync()
        result["initial_usage_percent"] = [round(loopfs.statvfs_usage(m)[2], 3) for m in mounts]
        config = work / "diskguard.toml"
        write_config(
            config, [m / "kafka-logs" for m in mounts], work / "state", args.limit, args.target
        )

        daemon = DaemonProcess(config)
        pid = daemon.proc.pid
        ctx = multiprocessing.get_context("fork")
        stop = ctx.Event()
        stats: Any = ctx.Queue()
        writers = []
        try:
            daemon.wait_for("daemon_started", 60)
            time.sleep(args.warmup)
            result["rss_kib_start"] = proc_rss_kib(pid)
            result["fds_start"] = proc_fds(pid)
            for layout in layouts:
                parts = sorted(layout.partitions.values(), key=lambda p: (p.topic, p.partition))
                w = ctx.Process(
                    target=writer_main,
                    args=(
                        [str(p.path) for p in parts],
                        [p.log_end_offset for p in parts],
                        args.rate_mib_s,
                        args.segment_mib * MIB,
                        stop,
                        stats,
                    ),
                    daemon=True,
                )
                w.start()
                writers.append(w)
            episodes = [Episodes(args.limit) for _ in mounts]
            samples: list[dict[str, Any]] = []
            started = time.monotonic()
            end = started + args.minutes * 60
            next_sample = started
            next_print = started + 60
            while time.monotonic() < end:
                now = time.monotonic()
                for ep, mnt in zip(episodes, mounts, strict=True):
                    ep.sample(loopfs.statvfs_usage(mnt)[2], now)
                if now >= next_sample:
                    samples.append(
                        {
                            "t_s": round(now - started, 1),
                            "rss_kib": proc_rss_kib(pid),
                            "fds": proc_fds(pid),
                            "usage_percent": [round(loopfs.statvfs_usage(m)[2], 2) for m in mounts],
                        }
                    )
                    next_sample += 10
                if now >= next_print:
                    worst = max(e.summary(now)["max_over_s"] for e in episodes)
                    print(
                        f"  {(now - started) / 60:4.1f} min: rss {proc_rss_kib(pid)} KiB, "
                        f"fds {proc_fds(pid)}, worst over-ceiling {worst:.3f} s",
                        flush=True,
                    )
                    next_print += 60
                if daemon.proc.poll() is not None:
                    raise RuntimeError(f"daemon exited {daemon.proc.returncode} mid-soak")
                if not all(w.is_alive() for w in writers):
                    raise RuntimeError("a writer died mid-soak")
                time.sleep(args.poll_ms / 1000)
            now = time.monotonic()
            result["per_disk"] = [e.summary(now) for e in episodes]
            result["rss_kib_end"] = proc_rss_kib(pid)
            result["fds_end"] = proc_fds(pid)
            result["samples"] = samples
        finally:
            stop.set()
            for w in writers:
                w.join(timeout=10)
            rc = daemon.stop()
        writer_stats = [stats.get(timeout=5) for _ in writers]
        result["written_mib"] = round(sum(s["written_bytes"] for s in writer_stats) / MIB, 1)
        result["segment_rolls"] = sum(s["rolls"] for s in writer_stats)
        result["writer_enospc"] = sum(s["enospc"] for s in writer_stats)
        result["daemon_exit_code"] = rc
        result["segments_deleted"] = daemon.count("segment_deleted")
        result["retention_cycles_logged"] = daemon.count("retention_cycle")
        result["errors"] = {name: daemon.count(name) for name in ERROR_EVENTS}
        cycles = [e for e in daemon.all_events if e.get("event") == "retention_cycle"]
        durations = sorted(float(e.get("duration_ms", 0)) for e in cycles)
        if durations:
            # Where the time over the ceiling goes: one cycle scans, plans and deletes (each
            # offline deletion fsyncs the audit log, the journal and the partition dir).
            result["retention_cycle_ms"] = {
                "p50": durations[len(durations) // 2],
                "p99": durations[int(0.99 * (len(durations) - 1))],
                "max": durations[-1],
                "max_segments_in_one_cycle": max(int(e.get("chosen_count", 0)) for e in cycles),
            }
        result["non_json_lines"] = len(daemon.non_json)
    result["max_over_ceiling_s"] = max(d["max_over_s"] for d in result["per_disk"])
    result["never_over_1s"] = all(d["episodes_over_1s"] == 0 for d in result["per_disk"])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--disks", type=int, default=3)
    parser.add_argument("--fs-mib", type=int, default=256)
    parser.add_argument("--limit", type=float, default=70.0)
    parser.add_argument("--target", type=float, default=65.0)
    parser.add_argument("--rate-mib-s", type=float, default=8.0, help="per disk")
    parser.add_argument("--partitions", type=int, default=8, help="written partitions per disk")
    parser.add_argument("--segment-mib", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=3.0, help="s after start before RSS")
    parser.add_argument("--poll-ms", type=float, default=2.0)
    parser.add_argument("--image-dir", default="/var/tmp/diskguard-soak")
    parser.add_argument("--out", default=str(RESULTS / "soak.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("soak: needs root (loop mounts)", file=sys.stderr)
        return 2
    print(
        f"soak: {args.disks} x {args.fs_mib} MiB ext4, {args.rate_mib_s} MiB/s each, "
        f"ceiling {args.limit}%, {args.minutes} min",
        flush=True,
    )
    result = soak(args)
    result["machine"] = machine_info()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"max over ceiling {result['max_over_ceiling_s']:.3f} s "
        f"(never over 1 s: {result['never_over_1s']}); "
        f"RSS {result['rss_kib_start']} -> {result['rss_kib_end']} KiB; "
        f"fds {result['fds_start']} -> {result['fds_end']}; "
        f"{result['segments_deleted']} segments deleted, {result['written_mib']} MiB written, "
        f"writer ENOSPC {result['writer_enospc']}, errors {result['errors']}, "
        f"daemon exit {result['daemon_exit_code']}"
    )
    print(f"written to {args.out}")
    ok = result["never_over_1s"] and result["daemon_exit_code"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
