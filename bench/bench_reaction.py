"""Reaction time of the daemon to a threshold crossing, and its idle cost.

Issue contract: time from threshold crossing to back-under-limit while a writer keeps rolling
segments (p50/p99 over many crossings); CPU and RSS of the idle daemon watching 100k segments.
Targets (issue 15): p99 < 0.5 s at 60 MiB/s with 100k segments, idle CPU < 0.5 %, RSS < 150 MB
(issue 6 had p99 < 1 s and idle CPU < 1 %).

Reaction: a 512 MiB loop-mounted ext4 holds a real-format log dir (``tests/support/kafkagen.py``);
``diskguard run`` (offline mode: no broker, no process holds ``.lock``) watches it. A writer
process plays the broker: it appends RecordBatch v2 batches (correct CRC32C) to the active
segment of several partitions, writes ``.index``/``.timeindex`` entries every
``index.interval.bytes`` into indexes preallocated sparse to 10 MiB, and rolls at
``--segment-mib`` (trims the indexes, appends the closing time-index entry, writes the producer
snapshot, opens a new active segment). This process polls ``statvfs`` every ~1 ms: a crossing
starts when df's Use% goes above ``disk_usage_percent`` and ends when it is back at or under.

Idle: a separate loop ext4 with 1,000 partitions x 100 segments (100k segments, 300k files,
``gen_tree.py``); the daemon runs with the default intervals and nothing to delete; CPU over
``--idle-seconds`` is the ``cpu_times`` delta over wall time (psutil), RSS is sampled every
second.

``--baseline REV`` runs every measurement a second time in the same run with the daemon of
commit ``REV`` (its ``daemon/`` exported with ``git archive``), on the same machine and trees.

Writes ``bench/results/reaction.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import multiprocessing
import os
import queue
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))

import crc32c

import gen_tree
import loopfs
from machine import RESULTS, ROOT, machine_info
from support import configs, kafkagen

DISKGUARD = ROOT / ".venv" / "bin" / "diskguard"
#: How DaemonProcess starts the daemon: this checkout, or a baseline commit (``--baseline``).
DAEMON_CMD: list[str] = [str(DISKGUARD)]
#: Issue 15's targets (issue 6 had 1 s and 1 %).
P99_TARGET_S = 0.5
IDLE_CPU_TARGET = 0.5
DAEMON_ENV: dict[str, str] | None = None


def use_baseline(rev: str, into: Path) -> None:
    """Run the daemon of commit ``rev`` from here on: its ``daemon/`` exported with ``git
    archive`` into ``into``, byte-compiled, on this venv's interpreter and libraries."""
    global DAEMON_CMD, DAEMON_ENV
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "daemon"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    python = str(ROOT / ".venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(into / "daemon")
    subprocess.run([python, "-m", "compileall", "-q", str(into / "daemon")], env=env, check=True)
    DAEMON_CMD, DAEMON_ENV = [python, "-m", "diskguard"], env


MIB = 1024 * 1024
INDEX_INTERVAL = 4096
SEGMENT_INDEX_BYTES = 10 * MIB
_OFFSET = struct.Struct(">q")
_TIMES = struct.Struct(">qq")
_TIME_ENTRY = struct.Struct(">qi")
_OFFSET_ENTRY = struct.Struct(">ii")
SEGMENT_SUFFIXES = (".log", ".index", ".timeindex")


# --------------------------------------------------------------------------- the writer


class _Partition:
    """One partition's active segment as a broker keeps it: log, offset and time index."""

    def __init__(self, path: str, next_offset: int, batch_records: int) -> None:
        self.path = path
        self.batch_records = batch_records
        self.next_offset = next_offset
        self.fds: dict[str, int] = {}
        self.rolls = 0
        self._open_segment(next_offset)

    def _open_segment(self, base: int) -> None:
        self.base = base
        self.position = 0
        self.since_entry = 0
        self.index_entries = 0
        self.time_entries = 0
        self.max_ts = -1
        self.offset_of_max = base
        self.last_time_entry_ts = -1
        stem = os.path.join(self.path, f"{base:020d}")
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        self.fds = {
            sfx: os.open(stem + sfx, flags, 0o644) for sfx in (".log", ".index", ".timeindex")
        }
        os.ftruncate(self.fds[".index"], SEGMENT_INDEX_BYTES - SEGMENT_INDEX_BYTES % 8)
        os.ftruncate(self.fds[".timeindex"], SEGMENT_INDEX_BYTES - SEGMENT_INDEX_BYTES % 12)

    def append(self, batch: bytearray, ts: int, span_ms: int) -> int:
        """``LogSegment.append``: the batch, then maybe one index entry of each kind."""
        last_offset = self.next_offset + self.batch_records - 1
        _OFFSET.pack_into(batch, 0, self.next_offset)
        _TIMES.pack_into(batch, 27, ts - span_ms, ts)
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
        os.write(self.fds[".log"], batch)
        if ts > self.max_ts:
            self.max_ts, self.offset_of_max = ts, last_offset
        if self.since_entry > INDEX_INTERVAL:
            os.pwrite(
                self.fds[".index"],
                _OFFSET_ENTRY.pack(last_offset - self.base, self.position),
                self.index_entries * 8,
            )
            self.index_entries += 1
            if self.max_ts > self.last_time_entry_ts:
                self._time_entry()
            self.since_entry = 0
        self.since_entry += len(batch)
        self.position += len(batch)
        self.next_offset = last_offset + 1
        return len(batch)

    def _time_entry(self) -> None:
        os.pwrite(
            self.fds[".timeindex"],
            _TIME_ENTRY.pack(self.max_ts, self.offset_of_max - self.base),
            self.time_entries * 12,
        )
        self.time_entries += 1
        self.last_time_entry_ts = self.max_ts

    def roll(self) -> None:
        """Close the active segment as ``onBecomeInactiveSegment`` does and open the next."""
        if self.max_ts > self.last_time_entry_ts:
            self._time_entry()
        os.ftruncate(self.fds[".index"], self.index_entries * 8)
        os.ftruncate(self.fds[".timeindex"], self.time_entries * 12)
        for fd in self.fds.values():
            os.close(fd)
        snapshot = os.path.join(self.path, f"{self.next_offset:020d}.snapshot")
        with open(snapshot, "wb") as fh:
            fh.write(kafkagen.empty_producer_snapshot())
        self.rolls += 1
        self._open_segment(self.next_offset)


def writer_main(
    part_dirs: list[str],
    next_offsets: list[int],
    rate_mib_s: float,
    segment_bytes: int,
    stop: Any,
    stats: Any,
) -> None:
    """Append to every partition in turn at ``rate_mib_s``; roll at ``segment_bytes``."""
    records = 64
    batch = bytearray(
        kafkagen.encode_batch(0, [1000 + i for i in range(records)], [b"v" * 1000] * records)
    )
    span = records - 1
    parts = [_Partition(d, o, records) for d, o in zip(part_dirs, next_offsets, strict=True)]
    written = 0
    enospc = 0
    started = time.monotonic()
    i = 0
    while not stop.is_set():
        part = parts[i % len(parts)]
        i += 1
        try:
            written += part.append(batch, int(time.time() * 1000), span)
            if part.position >= segment_bytes:
                part.roll()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            enospc += 1
            time.sleep(0.01)
        ahead = written / (rate_mib_s * MIB) - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)
    stats.put({"written_bytes": written, "rolls": sum(p.rolls for p in parts), "enospc": enospc})


# --------------------------------------------------------------------------- measuring


@dataclass
class Crossings:
    samples: list[float] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    peak: float = 0.0
    polls: int = 0
    #: Every return under the limit, including dips inside one episode.
    dips: int = 0
    stuck: str | None = None


def watch_crossings(
    mount: Path,
    limit: float,
    wanted: int,
    timeout: float,
    debounce: float,
    stuck_after: float,
    writer_alive: Callable[[], bool],
    t0: float,
) -> Crossings:
    """Poll df's Use% every ~1 ms; one sample per episode above ``limit``.

    An episode starts at the first poll above the limit and ends at the first poll back at or
    under it *that stays there for ``debounce`` s*: while the daemon deletes segment by segment
    and the writer keeps writing, usage can dip under and pop over again within milliseconds;
    that is still the same crossing, not a solved one.
    """
    out = Crossings()
    over_since: float | None = None
    under_since: float | None = None
    deadline = time.monotonic() + timeout
    while len(out.samples) < wanted and time.monotonic() < deadline:
        _u, _a, pct = loopfs.statvfs_usage(mount)
        now = time.monotonic()
        out.polls += 1
        if pct > limit:
            out.peak = max(out.peak, pct)
            if over_since is None:
                over_since = now
            under_since = None
            if now - over_since > stuck_after:
                out.stuck = f"usage stayed above {limit}% for {stuck_after:.0f} s (now {pct:.2f}%)"
                break
        elif over_since is not None:
            if under_since is None:
                under_since = now
                out.dips += 1
            elif now - under_since >= debounce:
                out.samples.append(under_since - over_since)
                out.windows.append((over_since - t0, under_since - t0))
                over_since = under_since = None
        if not writer_alive():
            out.stuck = "writer died"
            break
        time.sleep(0.001)
    return out


# --------------------------------------------------------------------------- the daemon


class DaemonProcess:
    """``diskguard run`` as a subprocess; its JSON log lines are collected by a thread."""

    def __init__(self, config: Path) -> None:
        self.proc = subprocess.Popen(
            [*DAEMON_CMD, "run", "-c", str(config)],
            env=DAEMON_ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.all_events: list[dict[str, Any]] = []
        self.non_json: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                self.non_json.append(line.rstrip())
                continue
            event["_t"] = time.monotonic()
            self.all_events.append(event)
            self.events.put(event)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip())

    def wait_for(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                tail = "\n".join(self.stderr[-20:] + self.non_json[-5:])
                raise RuntimeError(
                    f"daemon never logged {name!r} within {timeout:.0f} s "
                    f"(rc={self.proc.poll()}):\n{tail}"
                )
            try:
                event = self.events.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if event.get("event") == name:
                return event

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def count(self, name: str) -> int:
        return sum(1 for e in self.all_events if e.get("event") == name)


def write_config(
    path: Path,
    log_dir: Path,
    state_dir: Path,
    limit: float,
    target: float | None,
    bootstrap: str | None = None,
) -> None:
    """Offline mode, or with ``bootstrap`` broker mode against that broker."""
    broker = {"broker": {"bootstrap_servers": bootstrap}} if bootstrap else {}
    configs.write_config(
        path.parent,
        log_dir,
        snapshots={"host": "bench"},
        logging={"format": "json", "level": "info"},
        state_dir=state_dir,
        name=path.name,
        disk_usage_percent=limit,
        target_percent=target,
        mode="broker" if bootstrap else "offline",
        offline_headroom=0,
        **broker,
    )


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: p99 of 100 samples is the 99th)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- reaction


@dataclass(frozen=True)
class Scenario:
    """One reaction setup: a filesystem, what else lives on it, the writer's pace."""

    name: str
    fs_mib: int
    limit: float
    target: float
    rate_mib_s: float
    crossings: int
    #: Extra partitions x segments of tiny real segments (gen_tree) that the daemon must list
    #: on every cycle; their timestamps are in the future, so they are never the oldest.
    background: tuple[int, int] = (0, 0)


SCENARIOS = {
    "small": Scenario("small", 512, 70.0, 65.0, 30.0, 100),
    # 10k / 100k more segments (30k / 300k files) on the disk: what every cycle's rescan
    # costs as the tree grows (the scaling table; ``--scenarios 10k,100k``).
    "10k": Scenario("10k", 4096, 70.0, 69.0, 60.0, 50, background=(1000, 10)),
    "100k": Scenario("100k", 4096, 70.0, 69.0, 60.0, 50, background=(1000, 100)),
    # 1M segments (3M files, ~12 GB of 4 KiB blocks): a 24 GiB filesystem starts near half
    # full; not in the default set (the tree takes minutes to write): ``--scenarios 1M``.
    "1M": Scenario("1M", 24576, 70.0, 69.0, 60.0, 50, background=(1000, 1000)),
}
DEFAULT_SCENARIOS = ("small", "10k", "100k")


def reaction(args: argparse.Namespace, sc: Scenario) -> dict[str, Any]:
    image_dir = Path(args.image_dir)
    image, mnt = image_dir / f"reaction-{sc.name}.img", image_dir / f"reaction-{sc.name}.mnt"
    crossings = args.crossings or sc.crossings
    if args.rate:
        sc = dataclasses.replace(sc, rate_mib_s=args.rate)
    bg_parts, bg_segs = sc.background
    result: dict[str, Any] = {
        "scenario": sc.name,
        "filesystem_mib": sc.fs_mib,
        "limit_percent": sc.limit,
        "target_percent": sc.target,
        "writer_partitions": args.writer_partitions,
        "writer_rate_mib_s": sc.rate_mib_s,
        "segment_mib": args.segment_mib,
        "background_partitions": bg_parts,
        "background_segments": bg_parts * bg_segs,
    }
    inodes = max(65536, bg_parts * bg_segs * 4 + 65536)
    with (
        loopfs.loop_fs(image, mnt, sc.fs_mib * MIB, inodes, reuse=False, keep=False),
        workdir("diskguard-bench-reaction-") as work,
    ):
        log_dir = mnt / "kafka-logs"
        if bg_parts:
            future = int(time.time() * 1000) + 10 * 365 * 86_400_000
            gen_tree.generate(str(log_dir), bg_parts, bg_segs, end_ms=future)

        # Segments of ~1 MiB (records of 1000 B), hours apart: the writer's are all newer.
        def specs_for(n: int, records: int) -> list[kafkagen.SegmentSpec]:
            return [
                kafkagen.SegmentSpec(
                    records=records,
                    payload_size=1000,
                    records_per_batch=50,
                    first_timestamp_ms=kafkagen.DEFAULT_FIRST_TIMESTAMP_MS + k * 3_600_000,
                )
                for k in range(n)
            ]

        specs = {}
        for i in range(args.writer_partitions):
            specs[(f"hot-{i % 4}", i // 4)] = specs_for(3, 1000)
        for i in range(args.idle_partitions):
            specs[(f"cold-{i % 10}", i // 10)] = specs_for(4, 1000)
        layout = kafkagen.write_log_dir(log_dir, specs)
        os.sync()
        _used, _avail, pct = loopfs.statvfs_usage(mnt)
        result["initial_usage_percent"] = round(pct, 3)
        if pct >= sc.target:
            raise RuntimeError(f"initial usage {pct:.1f}% is already above the target")
        config = work / "diskguard.toml"
        write_config(config, log_dir, work / "state", sc.limit, sc.target)

        daemon = DaemonProcess(config)
        t0 = time.monotonic()
        try:
            daemon.wait_for("daemon_started", 600)
            result["daemon_start_s"] = round(time.monotonic() - t0, 3)
            hot = [
                p for (topic, _), p in sorted(layout.partitions.items()) if topic.startswith("hot-")
            ]
            ctx = multiprocessing.get_context("fork")
            stop, stats = ctx.Event(), ctx.Queue()
            writer = ctx.Process(
                target=writer_main,
                args=(
                    [str(p.path) for p in hot],
                    [p.log_end_offset for p in hot],
                    sc.rate_mib_s,
                    args.segment_mib * MIB,
                    stop,
                    stats,
                ),
                daemon=True,
            )
            writer.start()
            watch = watch_crossings(
                mnt,
                sc.limit,
                crossings,
                args.timeout,
                args.debounce,
                args.stuck_after,
                writer.is_alive,
                t0,
            )
            samples, windows = watch.samples, watch.windows
            peak_over, polls, stuck, raw_under = watch.peak, watch.polls, watch.stuck, watch.dips
            elapsed = time.monotonic() - t0
            stop.set()
            writer.join(timeout=10)
            writer_stats = stats.get(timeout=5) if writer.exitcode == 0 else {}
        finally:
            rc = daemon.stop()
        result.update(
            crossings=len(samples),
            debounce_s=args.debounce,
            raw_returns_under_limit=raw_under,
            polls=polls,
            poll_interval_ms=round(1000 * elapsed / max(1, polls), 3),
            p50_s=round(percentile(samples, 50), 4) if samples else None,
            p99_s=round(percentile(samples, 99), 4) if samples else None,
            max_s=round(max(samples), 4) if samples else None,
            mean_s=round(statistics.fmean(samples), 4) if samples else None,
            samples_s=[round(s, 4) for s in samples],
            peak_usage_percent=round(peak_over, 3),
            writer=writer_stats,
            stuck=stuck,
            daemon_exit_code=rc,
            daemon_events={
                name: daemon.count(name)
                for name in (
                    "retention_cycle",
                    "segment_deleted",
                    "cycle_failed",
                    "segment_delete_failed",
                    "retention_target_unreachable",
                )
            },
            daemon_cycle_ms=_cycle_stats(daemon.all_events),
            daemon_stderr_tail=daemon.stderr[-10:],
            daemon_log=_save_events(
                daemon.all_events, t0, str(image_dir / f"reaction-{sc.name}-daemon.jsonl")
            ),
            crossing_windows_s=[(round(a, 4), round(b, 4)) for a, b in windows],
            target_met=bool(samples) and percentile(samples, 99) < P99_TARGET_S and stuck is None,
        )
    return result


def _save_events(events: list[dict[str, Any]], t0: float, path: str) -> str:
    """The daemon's log lines, with ``_t`` = seconds since it was started, for analysis."""
    with open(path, "w", encoding="utf-8") as fh:
        for e in events:
            fh.write(json.dumps({**e, "_t": round(e["_t"] - t0, 4)}) + "\n")
    return path


def _cycle_stats(events: list[dict[str, Any]]) -> dict[str, float] | None:
    ms = [float(e["duration_ms"]) for e in events if e.get("event") == "retention_cycle"]
    if not ms:
        return None
    return {
        "count": len(ms),
        "p50": round(percentile(ms, 50), 1),
        "p99": round(percentile(ms, 99), 1),
        "max": round(max(ms), 1),
    }


# --------------------------------------------------------------------------- idle


def idle(args: argparse.Namespace) -> dict[str, Any]:
    image_dir = Path(args.image_dir)
    parts, segs = args.idle_tree_partitions, args.idle_tree_segments
    image, mnt = image_dir / f"idle-{parts}x{segs}.img", image_dir / f"idle-{parts}x{segs}.mnt"
    n = parts * segs
    result: dict[str, Any] = {"partitions": parts, "segments": n, "files": n * 3}
    size = max(1 << 30, n * 40 * 1024)
    with (
        loopfs.loop_fs(
            image, mnt, size, n * 4 + parts * 4 + 65536, reuse=args.keep, keep=args.keep
        ) as reused,
        workdir("diskguard-bench-idle-") as work,
    ):
        tree = mnt / "kafka-logs"
        marker = mnt / "bench-tree.json"
        want = {"partitions": parts, "segments": segs, "generator": 2}
        have = json.loads(marker.read_text()) if marker.exists() else None
        if not (reused and have == want):
            if reused:
                loopfs.umount(mnt)
                loopfs.make_image(image, size, n * 4 + parts * 4 + 65536)
                loopfs.mount(image, mnt)
            print(f"idle: generating {parts} x {segs} segments...", flush=True)
            result["generate_s"] = round(gen_tree.generate(str(tree), parts, segs), 1)
            marker.write_text(json.dumps(want))
        os.sync()
        _u, _a, pct = loopfs.statvfs_usage(mnt)
        result["usage_percent"] = round(pct, 3)
        config = work / "diskguard.toml"
        write_config(config, tree, work / "state", 95.0, None, args.idle_bootstrap)
        result["mode"] = "broker" if args.idle_bootstrap else "offline"
        daemon = DaemonProcess(config)
        t0 = time.monotonic()
        try:
            started = daemon.wait_for("daemon_started", 300)
            result["daemon_start_s"] = round(time.monotonic() - t0, 2)
            result["daemon_partitions"] = started.get("partitions")
            proc = psutil.Process(daemon.proc.pid)
            time.sleep(args.idle_settle)
            rss_peak = 0
            cpu0 = proc.cpu_times()
            w0 = time.monotonic()
            while time.monotonic() - w0 < args.idle_seconds:
                rss_peak = max(rss_peak, proc.memory_info().rss)
                time.sleep(1.0)
            cpu1 = proc.cpu_times()
            wall = time.monotonic() - w0
            rss_end = proc.memory_info().rss
            rss_peak = max(rss_peak, rss_end)
            hwm_kb = _vm_hwm_kb(proc.pid)
        finally:
            rc = daemon.stop()
        cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        result.update(
            measured_s=round(wall, 1),
            cpu_percent=round(100.0 * cpu / wall, 3),
            cpu_user_s=round(cpu1.user - cpu0.user, 3),
            cpu_system_s=round(cpu1.system - cpu0.system, 3),
            rss_mb=round(rss_end / MIB, 1),
            rss_peak_sampled_mb=round(rss_peak / MIB, 1),
            rss_hwm_mb=round(hwm_kb / 1024, 1) if hwm_kb else None,
            tree_reused=bool(reused),
            daemon_exit_code=rc,
            daemon_events={
                name: daemon.count(name) for name in ("retention_cycle", "cycle_failed")
            },
            daemon_stderr_tail=daemon.stderr[-10:],
            target_met=100.0 * cpu / wall < IDLE_CPU_TARGET and rss_peak / MIB < 150,
        )
    return result


def _vm_hwm_kb(pid: int) -> int | None:
    """Peak RSS of the process so far (``VmHWM``), startup scan included."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# --------------------------------------------------------------------------- main


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f} ms"


def print_summary(r: dict[str, Any]) -> None:
    print()
    for name, rx in r.get("reaction", {}).items():
        print(
            f"reaction [{name}: {rx['filesystem_mib']} MiB fs, "
            f"{rx['background_segments']:,} extra segments, "
            f"writer {rx['writer_rate_mib_s']:g} MiB/s]"
            f": {rx['crossings']} crossings  p50 {_ms(rx['p50_s'])}  "
            f"p99 {_ms(rx['p99_s'])}  max {_ms(rx['max_s'])}  "
            f"(target p99 < {P99_TARGET_S * 1000:.0f} ms; "
            f"peak usage {rx['peak_usage_percent']}% vs limit {rx['limit_percent']}%)"
        )
        if rx.get("stuck"):
            print(f"  PROBLEM: {rx['stuck']}")
    idl = r.get("idle")
    if idl:
        print(
            f"idle ({idl['segments']:,} segments): CPU {idl['cpu_percent']:.2f}% over "
            f"{idl['measured_s']:.0f} s, RSS {idl['rss_mb']:.1f} MB (peak sampled "
            f"{idl['rss_peak_sampled_mb']:.1f} MB, VmHWM {idl['rss_hwm_mb']} MB)  "
            f"(targets CPU < {IDLE_CPU_TARGET}%, RSS < 150 MB)"
        )


def measure(args: argparse.Namespace, label: str) -> dict[str, Any]:
    """The reaction scenarios and the idle run ``args`` asks for, with the daemon in use."""
    out: dict[str, Any] = {}
    if args.only in (None, "reaction"):
        out["reaction"] = {}
        for name in args.scenarios.split(","):
            print(f"{label}reaction [{name}]: writer vs daemon on a loop ext4...", flush=True)
            out["reaction"][name] = reaction(args, SCENARIOS[name])
    if args.only in (None, "idle"):
        print(f"{label}idle: daemon watching the idle tree...", flush=True)
        out["idle"] = idle(args)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image-dir", default="/var/tmp/diskguard-bench")
    ap.add_argument(
        "--scenarios", default=",".join(DEFAULT_SCENARIOS), help=f"of {', '.join(SCENARIOS)}"
    )
    ap.add_argument("--writer-partitions", type=int, default=8)
    ap.add_argument("--idle-partitions", type=int, default=20)
    ap.add_argument("--segment-mib", type=int, default=1)
    ap.add_argument("--crossings", type=int, default=0, help="override every scenario's count")
    ap.add_argument("--rate", type=float, default=0, help="override the writer's MiB/s")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--stuck-after", type=float, default=30.0)
    ap.add_argument(
        "--debounce", type=float, default=0.2, help="s under the limit that end a crossing"
    )
    ap.add_argument("--idle-tree-partitions", type=int, default=1000)
    ap.add_argument("--idle-tree-segments", type=int, default=100)
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--idle-settle", type=float, default=5.0)
    ap.add_argument(
        "--idle-bootstrap",
        metavar="HOST:PORT",
        help="the idle daemon in broker mode against this (running) broker; default offline",
    )
    ap.add_argument("--keep", action="store_true", help="keep (and reuse) the idle tree image")
    ap.add_argument("--only", choices=["reaction", "idle"])
    ap.add_argument("--out", default=str(RESULTS / "reaction.json"))
    ap.add_argument(
        "--baseline",
        metavar="REV",
        help="run every measurement again with the daemon of commit REV (same run, same trees)",
    )
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_reaction needs root (loop mounts)", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"benchmark": "reaction", **measure(args, "")}
    if args.baseline:
        use_baseline(args.baseline, Path(tempfile.mkdtemp(prefix="diskguard-bench-baseline-")))
        out["baseline"] = {
            "commit": args.baseline,
            **measure(args, f"baseline {args.baseline} "),
        }
    out["machine"] = machine_info()
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print_summary(out)
    if "baseline" in out:
        print(f"-- baseline {out['baseline']['commit']}, same run:")
        print_summary(out["baseline"])
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
