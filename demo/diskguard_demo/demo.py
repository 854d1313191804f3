"""``make demo``: the whole product on one machine in about a minute, with no Kafka and no root.

A simulated broker writes real-format segments (``diskguard_demo.segmentwriter``) into a sandbox
log dir; the real daemon (``diskguard run``, a subprocess with a generated config) guards it;
then the real Spark job (``diskguard aggregate``) turns the daemon's snapshot spool into a
report. What the user should see, as it happens:

- KIP-61 retention: the log dir is given a byte budget (``retention.max_bytes``), the broker
  keeps writing, and the daemon deletes the *globally oldest* closed segments across topics
  (``payments`` history is a day old, so it goes first; ``__consumer_offsets`` never goes).
- Qpid-style flow control: the sandbox lives on the host's own filesystem, which cannot be
  shrunk without root, so the limits are *byte* limits relative to the bytes in use. They
  are set (config rewrite + SIGHUP) only when "another application" on the same disk starts
  writing a big file, and parked out of reach again once the story is told: other processes
  on a busy host move the used bytes by gigabytes a minute, and limits set at the start
  tripped on their own. The file grows until the daemon reports ``overfull``; the daemon's
  ``exec`` actuator (a real ``on_change`` hook) tells the simulated broker to pause its
  producers; the file goes away, the daemon reports ``overfull_cleared``, producers resume.

Each phase waits for the events it depends on (daemon started, first deletions, config
reloaded, overfull, the hook's pause, overfull cleared, the hook's resume), each with a
bound that ends the demo with one line saying what did not happen, never for a wall-clock
guess: on a loaded 2-core machine the daemon's reactions come late, not never.

Deletion mode is ``offline``: with no broker holding ``<log_dir>/.lock`` there is nobody to
send ``DeleteRecords`` to, so diskguard deletes segment files itself (crash-safe rename to
``.deleted``, then unlink) — its rescue path for a broker that is down.

The margins are generous (hundreds of MiB) because other processes on the host move the used
bytes too: the limits must not trip before the burst nor fail to clear after it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from diskguard.host import fsusage
from diskguard.kafkalog.model import parse_segment_file, segment_file_name
from diskguard.kafkalog.scan import scan_log_dir
from diskguard.units import format_bytes
from diskguard_demo.segmentwriter import (
    ActiveSegment,
    empty_producer_snapshot,
    topic_id,
    write_checkpoint,
)

MiB = 1024 * 1024

#: Marks a directory this demo created, so a rerun may wipe it and nothing else.
MARKER = ".diskguard-demo"
SEGMENT_BYTES = 1 * MiB
BUDGET_BYTES = 32 * MiB
#: History written before the daemon starts: just under the budget, so deletions begin within
#: seconds of live writing.
HISTORY_BYTES = 28 * MiB
#: Live produce rate of the whole simulated broker.
PRODUCE_BYTES_PER_S = 1 * MiB
#: Flow-control limits, in bytes above the filesystem's used bytes when the burst starts
#: (``FlowLimitsFile.arm``). A busy build machine adds hundreds of MiB in seconds (test
#: suites make and drop loop images; 350 MiB in the 7 s of one armed window was seen): the
#: underfull limit sits close under overfull so that, once the file goes, the clear does
#: not depend on the rest of the host giving that back. The gap is still the hysteresis.
UNDERFULL_OVER_START = 640 * MiB
OVERFULL_OVER_START = 768 * MiB
#: The other application's file grows by this much per tick until the daemon says overfull
#: (fallocate: real blocks, no data written, so growing it costs no I/O).
BURST_STEP = 64 * MiB
BURST_MAX = 2048 * MiB
#: How long the disk stays overfull (producers paused) before the other application deletes
#: its file: long enough for snapshots (every 2 s) to record the episode.
HOLD_S = 5.0
#: Bound on each wait for the daemon (an event, the hook's flag); passing it fails the demo.
WAIT_S = 30.0
#: Refuse to start with less free space than this: the demo needs ~850 MiB at its peak.
MIN_AVAILABLE = 2048 * MiB
MIN_FREE_FLOOR = 64 * MiB
#: The other application stops growing its file before free space falls under this.
KEEP_FREE = 512 * MiB
TICK_S = 0.1
MIN_SECONDS = 10.0
SNAPSHOT_INTERVAL = "2s"

#: The exec actuator's hook: records the flow-control state where the simulated broker
#: looks for it (write + rename, so the broker never reads half a word).
HOOK = (
    "import os, sys; p = sys.argv[1]; "
    "open(p + '.tmp', 'w').write(os.environ['DISKGUARD_EVENT']); os.replace(p + '.tmp', p)"
)


@dataclass(frozen=True)
class TopicProfile:
    """One simulated topic: how much of the traffic it gets and how far back its data goes."""

    name: str
    partitions: int
    weight: float
    record_bytes: int
    history_hours: float


TOPICS: tuple[TopicProfile, ...] = (
    TopicProfile("orders", 3, 3.0, 600, 6.0),
    TopicProfile("clickstream", 2, 5.0, 300, 2.0),
    TopicProfile("payments", 1, 1.0, 400, 24.0),
    TopicProfile("__consumer_offsets", 1, 0.15, 120, 24.0),
)


# --------------------------------------------------------------------------- the broker


class PartitionLog:
    """One partition dir, appended to and rolled as a broker does."""

    def __init__(self, log_dir: Path, topic: TopicProfile, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.path = log_dir / f"{topic.name}-{partition}"
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "partition.metadata").write_text(
            f"version: 0\ntopic_id: {topic_id(topic.name)}\n"
        )
        (self.path / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
        self.active = ActiveSegment(self.path, 0)
        self.rolls = 0
        self._carry = 0.0

    def append(self, timestamps_ms: Sequence[int], values: Sequence[bytes]) -> int:
        # LogSegment: roll when the batch would not fit the segment any more.
        estimate = sum(len(v) for v in values) + 61 + 12 * len(values)
        if self.active.size and self.active.size + estimate > SEGMENT_BYTES:
            self.roll()
        return self.active.append(timestamps_ms, values)

    def roll(self) -> None:
        """Finish the active segment *before* the next one appears (so it is never deleted
        half-written), snapshot producer state, drop snapshots below the log start."""
        self.active.roll()
        base = self.active.next_offset
        (self.path / segment_file_name(base, ".snapshot")).write_bytes(empty_producer_snapshot())
        self._drop_old_snapshots()
        self.active = ActiveSegment(self.path, base)
        self.rolls += 1

    def _drop_old_snapshots(self) -> None:
        """Kafka deletes producer snapshots below the log start offset; so does this broker,
        or diskguard's deletions would leave one 4 KiB file behind per segment."""
        names = [parse_segment_file(n) for n in os.listdir(self.path)]
        logs = [p[0] for p in names if p is not None and p[1] == ".log"]
        if not logs:
            return
        start = min(logs)
        for parsed in names:
            if parsed is not None and parsed[1] == ".snapshot" and parsed[0] < start:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path / segment_file_name(parsed[0], ".snapshot"))

    def produce(self, nbytes: float, timestamp_ms: int, make: _Values) -> int:
        """Append about ``nbytes`` of records stamped ``timestamp_ms`` (carrying remainders)."""
        self._carry += nbytes
        count = int(self._carry // self.topic.record_bytes)
        if count == 0:
            return 0
        self._carry -= count * self.topic.record_bytes
        written = 0
        while count:
            n = min(count, 64)
            values = [make(self.topic, self.active.next_offset + i, timestamp_ms) for i in range(n)]
            written += self.append([timestamp_ms] * n, values)
            count -= n
        return written


class _Values:
    """Record values that look like JSON events of roughly the topic's record size."""

    def __init__(self) -> None:
        rnd = random.Random(61)
        self._filler = "".join(
            rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8192)
        )

    def __call__(self, topic: TopicProfile, offset: int, timestamp_ms: int) -> bytes:
        head = f'{{"topic":"{topic.name}","seq":{offset},"ts":{timestamp_ms},"body":"'
        pad = max(0, topic.record_bytes - len(head) - 2)
        start = (offset * 131) % (len(self._filler) - pad) if pad < len(self._filler) else 0
        return (head + self._filler[start : start + pad] + '"}').encode()


class SimulatedBroker:
    """All partitions of the sandbox log dir, each fed its topic's share of the traffic."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.partitions = [
            PartitionLog(log_dir, topic, p) for topic in TOPICS for p in range(topic.partitions)
        ]
        self._make = _Values()
        self.bytes_written = 0
        weights = {(pl.topic.name, pl.partition): pl.topic.weight for pl in self.partitions}
        total = sum(weights.values())
        self._share = {key: w / total for key, w in weights.items()}

    def write_log_dir_files(self) -> None:
        """meta.properties, the checkpoints, ``.lock`` (unlocked: no broker process holds it)."""
        (self.log_dir / "meta.properties").write_text(
            "#\n#Written by diskguard demo\ncluster.id=diskguard-demo\nnode.id=1\nversion=1\n"
        )
        ends = [(p.topic.name, p.partition, p.active.next_offset) for p in self.partitions]
        write_checkpoint(self.log_dir / "recovery-point-offset-checkpoint", ends)
        write_checkpoint(self.log_dir / "replication-offset-checkpoint", ends)
        write_checkpoint(self.log_dir / "log-start-offset-checkpoint", [])
        write_checkpoint(self.log_dir / "cleaner-offset-checkpoint", [])
        (self.log_dir / ".lock").touch()

    def backfill(self, total_bytes: int, now_ms: int) -> None:
        """History: each topic's share spread over its last ``history_hours``, oldest first."""
        steps = 400
        for part in self.partitions:
            share = total_bytes * self._share[(part.topic.name, part.partition)]
            start = now_ms - int(part.topic.history_hours * 3600_000)
            end = now_ms - 60_000
            for i in range(steps):
                ts = start + (end - start) * i // steps
                self.bytes_written += part.produce(share / steps, ts, self._make)

    def produce(self, nbytes: float, now_ms: int) -> None:
        for part in self.partitions:
            share = self._share[(part.topic.name, part.partition)]
            self.bytes_written += part.produce(nbytes * share, now_ms, self._make)

    @property
    def rolls(self) -> int:
        return sum(p.rolls for p in self.partitions)

    def close(self) -> None:
        for part in self.partitions:
            part.active.close()


# --------------------------------------------------------------------------- the daemon


class DaemonProcess:
    """``diskguard run`` as a subprocess; its JSON lines go to a log file and a queue."""

    def __init__(self, config: Path, log_path: Path) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._log = log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "diskguard", "run", "-c", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "<text>", "line": line.rstrip()}
            if not isinstance(event, dict):
                event = {"event": "<text>", "line": line.rstrip()}
            self.events.put(event)

    def dump_threads(self) -> None:
        """``kill -USR2``: the daemon writes every thread's stack to stderr (our log)."""
        self.proc.send_signal(signal.SIGUSR2)
        time.sleep(1.0)

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        self._log.close()
        return self.proc.returncode


# --------------------------------------------------------------------------- output


@dataclass
class Tally:
    """What the demo saw, for the summary and for choosing what to do next."""

    deleted: int = 0
    deleted_bytes: int = 0
    deleted_by_topic: dict[str, int] = field(default_factory=dict)
    overfull: int = 0
    cleared: int = 0
    overfull_now: bool = False
    overfull_since: float | None = None
    overfull_seconds: float = 0.0
    daemon_started: bool = False
    mode: str = "?"
    reloads: int = 0


def describe(event: dict[str, Any], used_over_start: int) -> str | None:
    """The one human line for a daemon event worth showing, else None (pure)."""
    name = event.get("event")
    level = event.get("level")
    if name == "segment_deleted":
        return (
            f"deleted {event.get('topic')}-{event.get('partition')} @ {event.get('base_offset')}"
            f" ({format_bytes(int(event.get('bytes') or 0))}, {event.get('mode')})"
        )
    if name in ("overfull", "overfull_cleared"):
        crossed = " and ".join(
            part.split("=")[0] for part in str(event.get("limit") or "").split(",") if part
        )
        what = "overfull on" if name == "overfull" else "overfull cleared on"
        relation = "crossed" if name == "overfull" else "under"
        return (
            f"{what} {event.get('mount')} (usage {event.get('usage_percent')}%,"
            f" used {signed_bytes(used_over_start)} since the limits were set;"
            f" {relation} {crossed})"
            f": {event.get('message')}"
        )
    if name == "disk_alert":
        where = event.get("mount")
        return f"alert level {event.get('alert_level')} on {where}: {event.get('message')}"
    if name == "daemon_started":
        return f"daemon started: {event.get('partitions')} partitions, mode {event.get('mode')}"
    if name == "retention_target_unreachable":
        return f"retention cannot reach its target on {event.get('mount')}: {event.get('reason')}"
    if name == "hook_finished" and event.get("exit_code") not in (0, None):
        return f"on_change hook failed: exit {event.get('exit_code')} {event.get('stderr')}"
    if name == "<text>":
        return f"daemon: {event.get('line')}"
    if level in ("warning", "error", "critical") and name != "overfull":
        details = {k: v for k, v in event.items() if k not in ("event", "level", "timestamp")}
        return f"daemon {level}: {name} {json.dumps(details, default=str)[:200]}"
    return None


def signed_bytes(n: int) -> str:
    """``+1.5 MiB`` / ``-3.0 MiB``: a change in used bytes."""
    return ("-" if n < 0 else "+") + format_bytes(abs(n))


def tally(t: Tally, event: dict[str, Any], now: float) -> None:
    name = event.get("event")
    if name == "segment_deleted":
        t.deleted += 1
        t.deleted_bytes += int(event.get("bytes") or 0)
        topic = str(event.get("topic"))
        t.deleted_by_topic[topic] = t.deleted_by_topic.get(topic, 0) + 1
    elif name == "overfull":
        t.overfull += 1
        t.overfull_now = True
        t.overfull_since = now
    elif name == "overfull_cleared":
        t.cleared += 1
        t.overfull_now = False
        if t.overfull_since is not None:
            t.overfull_seconds += now - t.overfull_since
        t.overfull_since = None
    elif name == "daemon_started":
        t.daemon_started = True
        t.mode = str(event.get("mode"))
    elif name == "config_reloaded":
        t.reloads += 1


def toml_config(
    sandbox: Path,
    log_dir: Path,
    state_dir: Path,
    flow_flag: Path,
    overfull_bytes: int,
    underfull_bytes: int,
) -> str:
    """The daemon's config for the sandbox (strings as JSON: valid TOML basic strings)."""
    q = json.dumps
    hook = [sys.executable, "-c", HOOK, str(flow_flag)]
    return f"""# Written by `python -m diskguard_demo` for the sandbox {sandbox}.
# Not a production config: the limits are bytes relative to what the disk held at start.

[broker]
log_dirs = [{q(str(log_dir))}]
segment_bytes = "1MiB"

[retention]
# No broker holds {log_dir}/.lock, so there is no one to send DeleteRecords to:
# diskguard deletes segment files itself (rename to .deleted, then unlink).
mode = "offline"
# The host's disk is not ours to fill: KIP-61's percent rule stays off, the byte budget acts.
disk_usage_percent = 100
max_bytes = {BUDGET_BYTES}   # {format_bytes(BUDGET_BYTES)}
# Offline, no broker can say which topics are compacted; the operator knows these three are
# cleanup.policy=delete. Any other topic (and always __consumer_offsets) stays protected.
assume_delete_policy = ["^orders$", "^clickstream$", "^payments$"]
check_interval = "2s"

[flow_control]
# Byte limits relative to the used bytes when the demo set them: parked out of reach (the
# disk's size) except while the "other application" writes its file, when they are the used
# bytes then + {format_bytes(OVERFULL_OVER_START)} / + {format_bytes(UNDERFULL_OVER_START)}.
overfull_bytes = {overfull_bytes}
underfull_bytes = {underfull_bytes}
min_free_bytes = "{MIN_FREE_FLOOR // MiB}MiB"
actuators = ["exec"]
on_change = {q(hook)}
on_change_timeout = "10s"

[snapshots]
interval = "{SNAPSHOT_INTERVAL}"

[logging]
format = "json"
level = "info"

[daemon]
state_dir = {q(str(state_dir))}
"""


class Console:
    """Timestamped lines relative to the demo's start."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        self.out.write(f"{self.elapsed():6.1f}s  {text}\n")
        self.out.flush()

    def plain(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()


# --------------------------------------------------------------------------- the run


@dataclass
class Sandbox:
    root: Path
    log_dir: Path
    state_dir: Path
    other_app: Path
    config: Path
    daemon_log: Path
    report_dir: Path
    flow_flag: Path

    @classmethod
    def at(cls, root: Path) -> Sandbox:
        return cls(
            root=root,
            log_dir=root / "kafka-logs",
            state_dir=root / "state",
            other_app=root / "other-app",
            config=root / "diskguard.toml",
            daemon_log=root / "daemon.log",
            report_dir=root / "report",
            flow_flag=root / "flow-control.state",
        )

    def prepare(self) -> None:
        """Create it afresh; wipe only a directory an earlier demo made (it has the marker)."""
        root = self.root
        if root.exists():
            if not root.is_dir():
                raise DemoError(f"{root}: exists and is not a directory")
            if any(root.iterdir()) and not (root / MARKER).exists():
                raise DemoError(
                    f"{root}: not empty and not made by the demo; refusing to wipe it"
                    " (choose another --dir)"
                )
            for entry in root.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        root.mkdir(parents=True, exist_ok=True)
        (root / MARKER).write_text("made by python -m diskguard_demo; safe to delete\n")
        for d in (self.log_dir, self.state_dir, self.other_app):
            d.mkdir()


class DemoError(Exception):
    """A reason the demo cannot run here; shown as one line, exit 2."""


class OtherApp:
    """An unrelated application filling the same disk (a heap dump, a runaway log)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self._fd: int | None = None

    def grow(self, step: int) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            # Real blocks, at once: df (and the daemon) see them immediately.
            os.posix_fallocate(self._fd, self.size, step)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.pwrite(self._fd, b"\0" * step, self.size)
            os.fsync(self._fd)
        self.size += step

    def remove(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def run(seconds: float, root: Path, keep: bool, out: TextIO) -> int:
    con = Console(out)
    box = Sandbox.at(root)
    box.prepare()
    start_usage = fsusage.filesystem_usage(str(box.root))
    if start_usage.available_bytes < MIN_AVAILABLE:
        raise DemoError(
            f"{box.root}: only {format_bytes(start_usage.available_bytes)} free on"
            f" {start_usage.mount}; the demo needs {format_bytes(MIN_AVAILABLE)}"
        )
    limits = FlowLimitsFile(box, start_usage.total_bytes)
    limits.park()
    total_partitions = sum(t.partitions for t in TOPICS)
    con.plain("diskguard demo: a simulated Kafka broker, the real daemon, the real Spark job")
    con.plain(f"  sandbox     {box.root}")
    con.plain(
        f"  log dir     {box.log_dir} ({total_partitions} partitions of {len(TOPICS)} topics,"
        f" segment.bytes {format_bytes(SEGMENT_BYTES)})"
    )
    con.plain(f"  config      {box.config}")
    con.plain(f"  daemon log  {box.daemon_log} (JSON lines)")
    con.plain(
        f"  retention   budget retention.max_bytes = {format_bytes(BUDGET_BYTES)} on the log dir:"
        " the globally oldest closed segments go first"
    )
    con.plain(
        f"  flow ctl    {start_usage.mount} is shared: when the other application starts,"
        f" overfull at its used bytes {signed_bytes(OVERFULL_OVER_START)}, cleared below"
        f" {signed_bytes(UNDERFULL_OVER_START)}"
    )
    con.plain(
        "  mode        offline: no broker holds the log dir's .lock, so there is no one to send"
    )
    con.plain(
        "              DeleteRecords to; diskguard deletes segment files itself (rename to"
        " .deleted, unlink)"
    )
    con.plain()

    broker = SimulatedBroker(box.log_dir)
    broker.backfill(HISTORY_BYTES, int(time.time() * 1000))
    broker.write_log_dir_files()
    con.say(
        f"broker: wrote {format_bytes(broker.bytes_written)} of history"
        f" ({', '.join(f'{t.name} {t.history_hours:g} h' for t in TOPICS)})"
    )
    daemon = DaemonProcess(box.config, box.daemon_log)
    con.say(
        f"daemon: {' '.join(['diskguard', 'run', '-c', str(box.config)])} (pid {daemon.proc.pid})"
    )
    t = Tally()
    other = OtherApp(box.other_app / "heap-dump.hprof")
    code = 1
    try:
        code = _main_loop(con, seconds, box, broker, daemon, other, t, limits)
    finally:
        other.remove()
        broker.close()
        if code and daemon.proc.poll() is None:
            daemon.dump_threads()  # where a daemon that stopped answering is, in its log
        rc = daemon.stop()
        while not daemon.events.empty():
            event = daemon.events.get()
            tally(t, event, con.elapsed())
            line = describe(event, _used_over(box.root, limits.base))
            if line:
                con.say(line)
    if code:
        return code
    log_bytes = scan_log_dir(str(box.log_dir), start_usage.mount, [], full=True).kafka_bytes or 0
    con.say(f"daemon stopped (exit {rc})")
    con.plain()
    by_topic = ", ".join(f"{k} {v}" for k, v in sorted(t.deleted_by_topic.items()))
    con.plain(
        f"retention: {t.deleted} segments deleted ({format_bytes(t.deleted_bytes)},"
        f" {t.mode}; {by_topic or 'none'}); log dir now {format_bytes(log_bytes)}"
        f" of the {format_bytes(BUDGET_BYTES)} budget"
    )
    con.plain(
        f"flow control: {t.overfull} overfull, {t.cleared} cleared"
        f" ({t.overfull_seconds:.1f} s with producers paused)"
    )
    if not keep:
        shutil.rmtree(box.log_dir, ignore_errors=True)
        con.plain(f"removed the simulated log dir {box.log_dir} (--keep keeps it)")
    return _aggregate(con, box)


def _used_over(path: Path, used0: int) -> int:
    try:
        return fsusage.filesystem_usage(str(path)).used_bytes - used0
    except OSError:
        return 0


class FlowLimitsFile:
    """The daemon's flow-control byte limits, rewritten in its config and applied by SIGHUP.

    Set relative to the used bytes only while the other application writes (``arm``), parked
    at the disk's size otherwise (``park``): the host's other processes then cannot trip (or
    hold) an overfull the story did not cause.
    """

    def __init__(self, box: Sandbox, total_bytes: int) -> None:
        self.box = box
        self.total = total_bytes
        #: Used bytes the limits are relative to (for the event lines).
        self.base = fsusage.filesystem_usage(str(box.root)).used_bytes

    def _write(self, overfull: int, underfull: int) -> None:
        box = self.box
        text = toml_config(box.root, box.log_dir, box.state_dir, box.flow_flag, overfull, underfull)
        tmp = box.config.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, box.config)

    def park(self) -> None:
        gap = OVERFULL_OVER_START - UNDERFULL_OVER_START
        self._write(self.total, self.total - gap)

    def arm(self) -> None:
        self.base = fsusage.filesystem_usage(str(self.box.root)).used_bytes
        self._write(self.base + OVERFULL_OVER_START, self.base + UNDERFULL_OVER_START)


class _Stage:
    """Where the story is; each stage waits for one thing, at most ``WAIT_S``."""

    STARTING = "the daemon to start"
    RETENTION = "the first deletions"
    ARMING = "the daemon to reload the armed limits"
    BURST = "the daemon to report overfull"
    PAUSING = "the on_change hook to pause the producers"
    HOLDING = "the hold before the file goes"
    CLEARING = "the daemon to report overfull_cleared"
    RESUMING = "the on_change hook to resume the producers"
    PARKING = "the daemon to reload the parked limits"
    TAIL = "the end of the run"


def _main_loop(
    con: Console,
    seconds: float,
    box: Sandbox,
    broker: SimulatedBroker,
    daemon: DaemonProcess,
    other: OtherApp,
    t: Tally,
    limits: FlowLimitsFile,
) -> int:
    """The story as stages, each entered when the event it waits for has happened.

    Nothing waits for a wall-clock guess: the burst starts at 40 % of the run but only after
    the first deletions, the file goes ``HOLD_S`` after the hook paused the producers, and
    the run ends at ``seconds`` but only once producers are resumed and the limits parked.
    A wait longer than ``WAIT_S`` ends the demo with a line naming what did not happen.
    """
    burst_at = 0.4 * seconds
    stage = _Stage.STARTING
    stage_since = time.monotonic()
    paused = False
    reloads = 0
    next_status = 10.0
    last = time.monotonic()

    def enter(new: str) -> None:
        nonlocal stage, stage_since
        stage, stage_since = new, time.monotonic()

    while True:
        now = time.monotonic()
        while True:
            try:
                event = daemon.events.get_nowait()
            except queue.Empty:
                break
            tally(t, event, con.elapsed())
            line = describe(event, _used_over(box.root, limits.base))
            if line:
                con.say(line)
        if daemon.proc.poll() is not None:
            con.say(
                f"the daemon exited early (exit {daemon.proc.returncode}); see {box.daemon_log}"
            )
            return 1
        waited = now - stage_since
        if stage not in (_Stage.HOLDING, _Stage.TAIL, _Stage.RETENTION) and waited > WAIT_S:
            con.say(f"gave up after {WAIT_S:g} s waiting for {stage}; see {box.daemon_log}")
            return 1
        elapsed = con.elapsed()

        flag = _read_flag(box.flow_flag)
        if flag == "overfull" and not paused:
            paused = True
            con.say("broker: producers paused (the on_change hook said overfull)")
        elif flag == "overfull_cleared" and paused:
            paused = False
            con.say("broker: producers resumed (the on_change hook said overfull_cleared)")
        if t.daemon_started and not paused:
            broker.produce(PRODUCE_BYTES_PER_S * (now - last), int(time.time() * 1000))
        last = now

        if stage == _Stage.STARTING and t.daemon_started:
            enter(_Stage.RETENTION)
        elif stage == _Stage.RETENTION:
            if t.deleted == 0 and waited > 2 * WAIT_S:
                con.say(f"gave up after {2 * WAIT_S:g} s waiting for {stage}")
                return 1
            if t.deleted and elapsed >= burst_at:
                reloads = t.reloads
                limits.arm()
                daemon.proc.send_signal(signal.SIGHUP)
                enter(_Stage.ARMING)
        elif stage == _Stage.ARMING and t.reloads > reloads:
            con.say(f"other-app: starts writing {other.path} on the same disk")
            enter(_Stage.BURST)
        elif stage == _Stage.BURST:
            if t.overfull_now:
                con.say(f"other-app: stopped at {format_bytes(other.size)}")
                enter(_Stage.PAUSING)
            elif other.size < BURST_MAX and _available(box.root) > BURST_STEP + KEEP_FREE:
                other.grow(BURST_STEP)
            # else: the file stays; the daemon must still see it (bounded by WAIT_S).
        elif stage == _Stage.PAUSING and paused:
            enter(_Stage.HOLDING)
        elif stage == _Stage.HOLDING and waited >= HOLD_S:
            con.say(f"other-app: deletes its {format_bytes(other.size)} file")
            other.remove()
            enter(_Stage.CLEARING)
        elif stage == _Stage.CLEARING and not t.overfull_now:
            enter(_Stage.RESUMING)
        elif stage == _Stage.RESUMING and not paused:
            reloads = t.reloads
            limits.park()
            daemon.proc.send_signal(signal.SIGHUP)
            enter(_Stage.PARKING)
        elif stage == _Stage.PARKING and t.reloads > reloads:
            enter(_Stage.TAIL)
        elif stage == _Stage.TAIL and elapsed >= seconds:
            return 0
        if t.daemon_started and elapsed >= next_status:
            next_status += 10.0
            scan = scan_log_dir(str(box.log_dir), "", [], full=True)
            con.say(
                f"status: log dir {format_bytes(scan.kafka_bytes or 0)} (budget"
                f" {format_bytes(BUDGET_BYTES)}), broker wrote {format_bytes(broker.bytes_written)}"
                f" in {broker.rolls} segment rolls"
            )
        time.sleep(TICK_S)


def _read_flag(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _available(path: Path) -> int:
    return fsusage.filesystem_usage(str(path)).available_bytes


def _aggregate(con: Console, box: Sandbox) -> int:
    spool = box.state_dir / "spool"
    cmd = [
        sys.executable,
        "-m",
        "diskguard",
        "aggregate",
        "--input",
        str(spool),
        "--output",
        str(box.report_dir),
    ]
    con.plain()
    con.say(f"spark: diskguard aggregate --input {spool} --output {box.report_dir}")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        con.say(f"spark: diskguard aggregate failed (exit {proc.returncode}):")
        for line in (proc.stderr or proc.stdout).strip().splitlines()[-10:]:
            con.plain(f"    {line}")
        return 1
    lines = proc.stdout.strip().splitlines()
    if lines:
        con.say(f"spark: {lines[0]}")
    report = box.report_dir / "report.html"
    if not report.is_file():
        con.say(f"spark: finished but {report} is missing")
        return 1
    con.plain()
    con.plain(f"report: {report}")
    con.plain(f"also:   {box.daemon_log} (the daemon's JSON events), {box.state_dir}/audit.jsonl")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diskguard_demo",
        description="Run diskguard against a simulated Kafka broker in a sandbox, then the"
        " Spark report. No Kafka, no root, no network.",
    )
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="how long the daemon runs (default 60)"
    )
    parser.add_argument(
        "--dir", type=Path, default=Path("demo-out"), help="sandbox directory (default ./demo-out)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the simulated log dir afterwards")
    args = parser.parse_args(argv)
    if args.seconds < MIN_SECONDS:
        parser.exit(2, f"diskguard demo: --seconds must be at least {MIN_SECONDS:g}\n")
    try:
        return run(args.seconds, args.dir.resolve(), args.keep, sys.stdout)
    except DemoError as exc:
        print(f"diskguard demo: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"diskguard demo: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("diskguard demo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
