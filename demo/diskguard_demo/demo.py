"""``make demo``: diskguard beside a real Kafka broker, the whole product in about two minutes.

A real Apache Kafka 4.x broker (KRaft, combined broker+controller, run as ``nobody``) gets a
small loop-mounted ext4 of its own; real producers (confluent-kafka) write four topics; the
real daemon (``diskguard run``) guards the disk in broker mode; then the story the product
exists for, phase by phase:

1. **Retention through the broker.** The disk nears its KIP-61 ceiling; the daemon asks the
   broker to delete the globally oldest segments (DeleteRecords) *ahead* of the ceiling: the
   broker frees them only at its next retention check, so the daemon forecasts from the growth
   rate and the broker's reclaim latency. The demo measures the disk itself (df) and shows
   each reclaim and the peak against the ceiling.
2. **Flow control with a real actuator.** A burst outruns the broker's reclaim: the disk goes
   overfull, the daemon adds a DENY WRITE ACL, the broker refuses the producers' writes
   (``TOPIC_AUTHORIZATION_FAILED``); once retention has brought the disk below the underfull
   limit the ACL goes and the producers write again.
3. **A broker that dies of a full disk, and the rescue.** The daemon is stopped (a host
   without a guard); the producers fill the disk until the broker halts ("Shutdown broker
   because all log dirs ... have failed"). ``diskguard enforce --once`` (auto mode: the broker
   does not answer and nobody holds ``.lock``, so offline) deletes a global-oldest prefix of
   segment files; the broker starts again and serves from the new log starts.
4. **The fleet view.** The snapshots the daemon shipped to a real topic go through the Spark
   job (``diskguard aggregate --input kafka://...``) into ``report.html``.

Every phase waits for the events it depends on, each wait bounded: one that runs out ends
the demo (exit 1) with one line saying what did not happen, never a wall-clock guess (on a
loaded 2-core machine reactions come late, not never). The compacted ``customers`` topic holds
the oldest data on the disk and is never deleted, nor ``__consumer_offsets``: the demo checks
their files itself at the end.

It needs root (a loop-mounted disk, a broker run as another user) and Java (the broker, and
Spark): without either it says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from diskguard.units import format_bytes
from diskguard_demo.errors import Refused, Stalled
from diskguard_demo.guard import (
    CEILING_PERCENT,
    OVERFULL_PERCENT,
    SNAPSHOTS_TOPIC,
    TARGET_PERCENT,
    UNDERFULL_PERCENT,
    DaemonProcess,
    aggregate,
    config_text,
    enforce_once,
    plan,
)
from diskguard_demo.narration import Console, Deletions, Tally, batch_line, percent, take
from diskguard_demo.traffic import TOPICS, MiB, Traffic

if TYPE_CHECKING:
    from diskguard_demo.world import BrokerHost, Sandbox
    from support.kafka import Target

#: History written before the daemon starts, as a share of the disk.
HISTORY_SHARE = 0.30
#: The producers' steady rate and their burst (a rate the broker's reclaim cannot follow).
STEADY_BYTES_PER_S = 2 * MiB
BURST_BYTES_PER_S = 8 * MiB
#: How long a phase may wait for the daemon or the broker.
WAIT_S = 90.0
#: The broker's ``Deleting segment files`` lines of one reclaim come within this of each other.
RECLAIM_QUIET_S = 0.5
#: Retention cycles are told together, at most this often (under a burst there is one per
#: usage poll).
BATCH_S = 2.0
#: A line saying how full the disk is, this often while producers write.
STATUS_S = 10.0
GROUP = "billing"


def preflight() -> Target:
    """Root, Java and the harness, then the broker's jars (Maven on the first run)."""
    if os.geteuid() != 0:
        raise Refused(
            "needs root: the broker gets a loop-mounted ext4 disk of its own to fill, and runs"
            " as nobody (run `sudo make demo`)"
        )
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise Refused(
            "java not found: the demo runs a real Kafka broker and Spark, both on a JDK 17"
            " (`make tools` installs it with Maven)"
        )
    try:
        from support.kafka import KafkaResolutionError, target
    except ImportError:
        raise Refused(
            "the Kafka harness (tests/support/kafka) is not importable: run `make demo`"
            " (PYTHONPATH=demo:tests)"
        ) from None
    try:
        return target()
    except KafkaResolutionError as exc:
        raise Refused(str(exc)) from None


class Story:
    """The phases, and the one loop that waits: daemon events, producers' notices, df."""

    def __init__(self, con: Console, box: Sandbox, host: BrokerHost) -> None:
        self.con = con
        self.box = box
        self.host = host
        self.t = Tally()
        self.daemon: DaemonProcess | None = None
        self.traffic: Traffic | None = None
        self.usage = 0.0
        self.peak = 0.0
        self.over_s = 0.0
        self.retention_peak = 0.0
        self.retention_over_s = 0.0
        self.held_seconds = 0.0
        self.refused = 0
        self.reclaims = 0
        self._reclaim_files = 0
        self._reclaim_partitions: set[str] = set()
        self._reclaim_from = 0.0
        self._reclaim_last = 0.0
        self._samples: list[tuple[float, float]] = []
        self._last_status = time.monotonic()
        self._last_sample = time.monotonic()

    # -- waiting ---------------------------------------------------------------------------
    def pump(self) -> None:
        """Tell what happened since the last call: events, producers, reclaims on the disk."""
        if self.daemon is not None:
            while not self.daemon.events.empty():
                line = take(self.t, self.daemon.events.get())
                if line:
                    self.tell_line(line)
        if self.traffic is not None:
            while not self.traffic.notices.empty():
                self.tell_line(self.traffic.notices.get())
        if self.t.batch and time.monotonic() - self.t.batch_since >= BATCH_S:
            self.tell_line(None)
        self._sample()
        if self.traffic is not None and time.monotonic() - self._last_status >= STATUS_S:
            self._last_status = time.monotonic()
            self.tell_line(
                f"disk: {self.usage:.1f}% used; producers delivered"
                f" {format_bytes(self.traffic.delivered_bytes)} so far"
            )

    def tell_line(self, line: str | None) -> None:
        """Print ``line``, after the retention cycles not told yet (so the order holds)."""
        told = batch_line(self.t)
        if told:
            self.con.say(told)
        if line:
            self.con.say(line)

    def _sample(self) -> None:
        from support.disks import df_percent

        now = time.monotonic()
        self.usage = df_percent(self.host.mount)
        if self.usage > CEILING_PERCENT:
            self.over_s += now - self._last_sample
        self._last_sample = now
        self.peak = max(self.peak, self.usage)
        self._samples = [(t, u) for t, u in self._samples if now - t <= 3.0]
        self._samples.append((now, self.usage))
        self._watch_broker_log(now)

    def _watch_broker_log(self, now: float) -> None:
        """The broker's own word for a reclaim: its ``Deleting segment files`` lines (the
        unlinks, a delete delay after the retention check renamed them), told once they stop
        coming, with df before and after."""
        for line in self.host.new_log_lines():
            if "Deleting segment files" not in line:
                continue
            if not self._reclaim_files:
                self._reclaim_from = max(u for _t, u in self._samples)
            self._reclaim_files += line.count("LogSegment(")
            self._reclaim_partitions.add(line.split("partition=", 1)[-1].split(",", 1)[0])
            self._reclaim_last = now
        if self._reclaim_files and now - self._reclaim_last >= RECLAIM_QUIET_S:
            self.reclaims += 1
            self.tell_line(
                f"broker: deleted {self._reclaim_files} segments of"
                f" {len(self._reclaim_partitions)} partitions (its retention check, then the"
                f" delete delay): disk {self._reclaim_from:.1f}% -> {self.usage:.1f}%"
            )
            self._reclaim_files = 0
            self._reclaim_partitions = set()

    def wait(self, what: str, done: Callable[[], bool], bound: float = WAIT_S) -> None:
        deadline = time.monotonic() + bound
        while True:
            self.pump()
            if done():
                return
            if self.daemon is not None and self.daemon.exited() is not None:
                raise Stalled(
                    f"the daemon exited (exit {self.daemon.exited()}) while the demo waited for"
                    f" {what}; see {self.box.daemon_log}"
                )
            if time.monotonic() > deadline:
                raise Stalled(f"gave up after {bound:g} s waiting for {what}")
            time.sleep(0.1)

    # -- the story -------------------------------------------------------------------------
    def tell(self, chosen: Target) -> int:
        self._start_broker(chosen)
        self._topics_and_history()
        protected = self._protected_files()
        self._start_daemon()
        self._retention()
        self._flow_control()
        self._full_disk()
        rescued = self._rescue()
        self._broker_back(rescued)
        kept = self._check_protected(protected)
        code = self._spark()
        self._summary(rescued, kept)
        return code or (0 if kept else 1)

    def _start_broker(self, chosen: Target) -> None:
        from diskguard_demo.world import CHECK_INTERVAL_MS, DELETE_DELAY_MS
        from support.disks import disk_capacity

        broker = self.host.broker
        self.con.say(
            f"disk: {format_bytes(disk_capacity(self.host.mount))} ext4 (loop, 5 % root reserve)"
            f" at {self.host.mount}"
        )
        self.con.say(
            f"broker: starting {chosen} as nobody, log dir {self.host.log_dir}"
            f" (retention check every {CHECK_INTERVAL_MS / 1000:g} s, delete delay"
            f" {DELETE_DELAY_MS / 1000:g} s; Kafka's defaults, 300 s + 60 s, are why diskguard"
            " forecasts ahead)"
        )
        started = time.monotonic()
        broker.start()
        self.con.say(
            f"broker: up at {broker.bootstrap} in {time.monotonic() - started:.0f} s"
            f" (pid {broker.pid()})"
        )

    def _topics_and_history(self) -> None:
        from support.disks import disk_capacity

        broker = self.host.broker
        for topic in TOPICS:
            broker.create_topic(topic.name, topic.partitions, **topic.configs())
        broker.create_topic(SNAPSHOTS_TOPIC, 1)
        self.con.say(
            "broker: topics "
            + ", ".join(
                f"{t.name} ({t.partitions}p{', compacted' if t.compacted else ''})" for t in TOPICS
            )
            + f", {SNAPSHOTS_TOPIC}; 1 MiB segments"
        )
        self.traffic = Traffic(broker.bootstrap)
        history = int(disk_capacity(self.host.mount) * HISTORY_SHARE)
        wrote = self.traffic.backfill(history, int(time.time() * 1000))
        self.con.say(
            f"producers: wrote {format_bytes(wrote)} of history ("
            + ", ".join(f"{t.name} {t.history_hours:g} h" for t in TOPICS)
            + " back)"
        )
        self._commit_group()
        self._sample()
        self._last_status = time.monotonic()
        self.con.say(f"disk: {self.usage:.1f}% used")

    def _commit_group(self) -> None:
        """A consumer group that has read ``payments`` (its offsets: ``__consumer_offsets``)."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        broker = self.host.broker
        consumer = Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": GROUP, "log_level": 0}
        )
        try:
            _low, high = consumer.get_watermark_offsets(TopicPartition("payments", 0), timeout=30)
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    consumer.commit(
                        offsets=[TopicPartition("payments", 0, high)], asynchronous=False
                    )
                    break
                except KafkaException as exc:
                    # The group coordinator loads its __consumer_offsets partition first
                    # (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS for a while).
                    if time.monotonic() > deadline:
                        raise Stalled(f"group {GROUP} could not commit: {exc}") from None
                    time.sleep(0.5)
        finally:
            consumer.close()
        self.con.say(
            f"consumers: group {GROUP} has consumed payments-0 up to offset {high} (committed:"
            " __consumer_offsets)"
        )

    def _protected_files(self) -> dict[str, set[str]]:
        """The segment files of the topics that must never lose any (checked at the end)."""
        out: dict[str, set[str]] = {}
        for pdir in sorted(self.host.log_dir.iterdir()):
            name = pdir.name
            if pdir.is_dir() and (name.startswith("customers-") or name.startswith("__")):
                out[name] = {p.name for p in pdir.glob("*.log")}
        return out

    def _start_daemon(self) -> None:
        broker = self.host.broker
        self.box.config.write_text(
            config_text(
                self.box.root,
                self.host.log_dir,
                broker.bootstrap,
                self.host.server_properties,
                self.box.state_dir,
            )
        )
        self.daemon = DaemonProcess(self.box.config, self.box.daemon_log)
        self.con.say(f"daemon: diskguard run -c {self.box.config} (pid {self.daemon.proc.pid})")
        self.wait("the daemon to start (daemon_started)", lambda: self.t.started is not None)
        if self.t.policies:
            self.con.say(
                "daemon: cleanup.policy from the broker: "
                + ", ".join(f"{k} {v}" for k, v in sorted(self.t.policies.items()))
            )
        try:
            protected = plan(self.box.config).get("protected") or []
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            raise Stalled(str(exc)) from None
        self.con.say(
            f"diskguard plan -c {self.box.config}: never deleted here: "
            + "; ".join(f"{p.get('topic')} ({p.get('reason')})" for p in protected)
        )

    def _retention(self) -> None:
        assert self.traffic is not None
        self.con.plain()
        self.con.say(
            f"--- 1. retention through the broker: ceiling {CEILING_PERCENT}%,"
            f" target {TARGET_PERCENT}%; producers write {format_bytes(STEADY_BYTES_PER_S)}/s"
        )
        self.peak, self.over_s, self.reclaims = self.usage, 0.0, 0
        self.traffic.set_rate(STEADY_BYTES_PER_S)
        self.traffic.start()
        self.wait(
            "the daemon's first DeleteRecords (retention_cycle in broker mode)",
            lambda: any(c.get("mode") == "broker" for c in self.t.cycles),
        )
        self.wait(
            "the broker to delete the segments asked for (Deleting segment files in its log)",
            lambda: self.reclaims >= 1,
        )
        self.wait("the broker's second reclaim", lambda: self.reclaims >= 2)
        self.tell_line(None)
        self.retention_peak, self.retention_over_s = self.peak, self.over_s
        held = "held" if self.peak <= CEILING_PERCENT else "NOT held"
        self.con.say(
            f"retention: the ceiling {held}: peak {self.peak:.1f}% (ceiling {CEILING_PERCENT}%,"
            f" {self.over_s:.1f} s over); {self.t.deleted.count} segments"
            f" ({format_bytes(self.t.deleted.bytes)}) asked of the broker"
        )

    def _flow_control(self) -> None:
        traffic = self.traffic
        assert traffic is not None
        self.con.plain()
        self.con.say(
            f"--- 2. flow control: overfull at {OVERFULL_PERCENT}%, cleared below"
            f" {UNDERFULL_PERCENT}%; a burst: producers write"
            f" {format_bytes(BURST_BYTES_PER_S)}/s"
        )
        traffic.set_rate(BURST_BYTES_PER_S)
        self.wait("the daemon to report overfull", lambda: self.t.overfull_now)
        self.wait("the daemon's DENY WRITE ACL (acl_applied)", lambda: bool(self.t.acl_applied))
        self.wait("the broker to refuse the producers' writes", lambda: traffic.held)
        traffic.set_rate(STEADY_BYTES_PER_S)
        self.con.say("producers: the burst is over (back to the steady rate once allowed)")
        self.wait("the daemon to report overfull_cleared", lambda: not self.t.overfull_now)
        self.wait("the daemon to remove its ACLs (acl_removed)", lambda: bool(self.t.acl_removed))
        self.wait("the producers to write again", lambda: not traffic.held)
        self.tell_line(None)
        self.con.say(
            f"flow control: {len(self.t.overfull)} overfull, {len(self.t.cleared)} cleared;"
            f" producers held back {traffic.held_seconds:.1f} s, {traffic.refused} records"
            " refused"
        )
        self.held_seconds, self.refused = traffic.held_seconds, traffic.refused

    def _full_disk(self) -> None:
        traffic, daemon = self.traffic, self.daemon
        assert traffic is not None and daemon is not None
        broker = self.host.broker
        self.con.plain()
        self.con.say("--- 3. a broker without a guard dies of a full disk")
        rc = daemon.stop()
        self.pump()
        self.tell_line(None)
        self.daemon = None
        self.con.say(f"daemon: stopped (exit {rc}): from here on, nobody guards this disk")
        traffic.set_rate(None)
        self.con.say("producers: write as fast as the broker takes it")
        self.wait("the broker to die of the full disk", lambda: not broker.alive(), bound=180)
        halted = [
            line
            for line in broker.log_since_start().splitlines()
            if "Shutdown broker because" in line
        ]
        self.con.say(
            f"broker: dead (disk {self.usage:.1f}% used): "
            + (halted[-1].split("] ", 1)[-1][:160] if halted else "no shutdown line in its log")
        )
        traffic.stop(flush_s=1.0)
        self.traffic = None

    def _rescue(self) -> Deletions:
        from support.disks import df_percent

        self.con.plain()
        self.con.say(f"--- 4. the rescue: diskguard enforce --once -c {self.box.config}")
        before = df_percent(self.host.mount)
        rc, events = enforce_once(self.box.config, self.box.rescue_log)
        rescue = Tally()
        for event in events:
            line = take(rescue, event, who="enforce")
            if line:
                self.con.say(line)
        told = batch_line(rescue, who="enforce")
        if told:
            self.con.say(told)
        after = df_percent(self.host.mount)
        modes = {c.get("mode") for c in rescue.cycles}
        swept = (
            f", and {format_bytes(rescue.swept_bytes)} of *.deleted leftovers swept"
            if rescue.swept_bytes
            else ""
        )
        self.con.say(
            f"enforce: exit {rc}, mode {', '.join(sorted(map(str, modes))) or '?'}; disk"
            f" {before:.1f}% -> {after:.1f}% ({rescue.deleted.count} segments,"
            f" {format_bytes(rescue.deleted.bytes)}{swept}; its events: {self.box.rescue_log})"
        )
        if rc != 0 or not rescue.deleted.count:
            raise Stalled(f"enforce --once did not rescue the disk (exit {rc}); see its log")
        return rescue.deleted

    def _broker_back(self, rescued: Deletions) -> None:
        broker = self.host.broker
        started = time.monotonic()
        broker.start()
        self.con.say(f"broker: started again, up in {time.monotonic() - started:.0f} s")
        refused = broker.produce("orders", 10, 100, settings={"acks": "all"})
        if refused:
            raise Stalled(f"the restarted broker refused writes: {refused[0]}")
        starts: list[str] = []
        for topic, part in [*sorted(rescued.by_partition), ("customers", 0)]:
            ((low, first),) = broker.first_offsets(topic, (part,), timeout=20).values()
            if first < 0:
                raise Stalled(f"reading {topic}-{part} from its new log start {low}")
            starts.append(f"{topic}-{part} from {first}")
        self.con.say(
            "broker: serves again; accepts writes; a reader gets "
            + ", ".join(starts)
            + " (the new log starts)"
        )
        errors = [
            line.split("] ERROR ", 1)[1]
            for line in broker.log_since_start().splitlines()
            if "] ERROR " in line
        ]
        self.con.say(
            f"broker: {len(errors)} ERROR lines in its log since the restart"
            + (f" (the first: {errors[0][:200]})" if errors else "")
        )

    def _check_protected(self, before: dict[str, set[str]]) -> bool:
        """Every segment file of the compacted and internal topics is still there."""
        missing = {
            name: sorted(files - {p.name for p in (self.host.log_dir / name).glob("*.log")})
            for name, files in before.items()
        }
        lost = {k: v for k, v in missing.items() if v}
        if lost:
            self.con.say(f"PROTECTED DATA DELETED: {lost}")
        return not lost

    def _spark(self) -> int:
        source = f"kafka://{self.host.broker.bootstrap}/{SNAPSHOTS_TOPIC}"
        self.con.plain()
        self.con.say(f"--- 5. the fleet view: diskguard aggregate --input {source}")
        started = time.monotonic()
        proc = aggregate(source, self.box.report_dir)
        took = time.monotonic() - started
        if proc.returncode != 0:
            self.con.say(f"spark: diskguard aggregate failed (exit {proc.returncode}):")
            for line in (proc.stderr or proc.stdout).strip().splitlines()[-10:]:
                self.con.plain(f"    {line}")
            return 1
        lines = proc.stdout.strip().splitlines()
        self.con.say(f"spark: {lines[0] if lines else '(no summary line)'} ({took:.0f} s)")
        report = self.box.report_dir / "report.html"
        if not report.is_file():
            self.con.say(f"spark: finished but {report} is missing")
            return 1
        return 0

    def _summary(self, rescued: Deletions, kept: bool) -> None:
        t = self.t
        self.con.plain()
        self.con.plain(
            f"retention (broker mode): {t.deleted.count} segments"
            f" ({format_bytes(t.deleted.bytes)}) by DeleteRecords, globally oldest first"
            f" ({t.deleted.summary(4)}); before the burst, peak {self.retention_peak:.1f}% against"
            f" a {CEILING_PERCENT}% ceiling ({self.retention_over_s:.1f} s over)"
        )
        self.con.plain(
            f"flow control (acl): {len(t.overfull)} overfull"
            f" ({', '.join(percent(e.get('usage_percent')) for e in t.overfull)}),"
            f" {len(t.cleared)} cleared; producers held back {self.held_seconds:.1f} s"
            f" ({self.refused} records refused)"
        )
        self.con.plain(
            f"rescue (offline): {rescued.count} segments ({format_bytes(rescued.bytes)}),"
            f" {rescued.summary(4)}; the broker came back"
        )
        self.con.plain(
            "kept: customers (compacted; the oldest data on the disk), __consumer_offsets,"
            " __cluster_metadata: "
            + ("every segment still there" if kept else "SOME SEGMENTS WENT (see above)")
        )
        self.con.plain(f"report: {self.box.report_dir / 'report.html'}")
        self.con.plain(
            f"also:   {self.box.daemon_log} (the daemon's JSON events), {self.box.rescue_log},"
            f" {self.box.state_dir}/audit.jsonl, {self.box.broker_log}"
        )


def _terminate(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM/SIGHUP end the demo like Ctrl-C: everything it started is stopped."""
    raise KeyboardInterrupt


def run(root: Path, out: TextIO) -> int:
    chosen = preflight()
    from diskguard_demo.world import BrokerHost, Sandbox
    from support.fsfixtures import FilesystemSetupError
    from support.kafka.node import ServerSetupError

    con = Console(out)
    box = Sandbox(root)
    for line in box.prepare():
        con.say(f"cleanup of an interrupted run: {line}")
    con.plain(f"diskguard demo: a real Kafka broker, the real daemon, the real Spark job ({root})")
    try:
        with BrokerHost(box, chosen) as host:
            story = Story(con, box, host)
            try:
                return story.tell(chosen)
            except Stalled as exc:
                story.pump()
                con.say(f"{exc}; see {box.daemon_log} and {box.broker_log}")
                return 1
            finally:
                if story.daemon is not None:
                    story.daemon.dump_threads()
                    story.daemon.stop()
                if story.traffic is not None:
                    story.traffic.stop(flush_s=1.0)
    except (FilesystemSetupError, ServerSetupError) as exc:
        con.say(f"{str(exc).splitlines()[0]} (see {box.broker_log})")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diskguard_demo",
        description="diskguard beside a real Kafka 4.x broker on a disk of its own: retention"
        " through the broker, flow control, a broker dead of a full disk and its rescue, the"
        " Spark report. Needs root and Java.",
    )
    parser.add_argument(
        "--dir", type=Path, default=Path("demo-out"), help="sandbox directory (default ./demo-out)"
    )
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    try:
        return run(args.dir.resolve(), sys.stdout)
    except Refused as exc:
        print(f"diskguard demo: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"diskguard demo: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("diskguard demo: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one line, never a traceback; everything started is stopped
        print(f"diskguard demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
