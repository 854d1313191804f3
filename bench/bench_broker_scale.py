"""Broker mode at scale: a real Kafka broker with thousands of partitions, ``diskguard run`` in
broker mode, one write burst over the ceiling.

A real Apache Kafka broker (the project's harness, ``tests/support/kafka``: ``--release``,
default the newest 4.x in KRaft mode) runs as ``nobody`` with its log dir on a fresh loop ext4;
``--partitions`` partitions (``--per-topic`` to a topic) each get ``--segments`` closed
segments of ``--segment-kib`` first, and a consumer group commits offsets on half the topics
(so the cycle's OffsetFetch has something to say). ``--filled N``: only the first N partitions
(whole topics) are prefilled, committed and written by the burst; the others stay empty, one
active segment each, as most partitions of a large cluster are small. A broker holds a
descriptor per segment, so this is how a size near the open-files limit fits at all. Per
size, per daemon variant (this checkout; ``--baseline REV`` the daemon code of REV, in the
same run, on the same broker):

- **burst**: the daemon runs in broker mode with its ceiling a few points above today's
  usage, with librdkafka's ``debug = "protocol"`` (every request the client sends and every
  answer it receives is a log line: name, version, bytes); after it started and settled, a
  producer writes ``--burst-percent`` of the disk at full speed over every partition. Reported:
  each retention cycle that acted (``retention_cycle``: wall time, segments chosen), and the
  requests sent during it, per API (count, bytes sent, bytes received), plus the requests of
  the whole run from ``daemon_started`` on.
- **idle**: the daemon again (info logging, no protocol debug) with nothing to delete, every
  variant at once on the same broker: its CPU (user + system, psutil) over
  ``--idle-seconds`` after ``--idle-settle``, RSS, and the mean retention cycle from its
  metrics (``diskguard_scan_duration_seconds``). An idle daemon's consistency rescan comes
  every 60–300 s: a window shorter than that may hold none of them.

Before measuring, the bench waits until the broker is at rest (``--broker-rest`` s without
an event in any partition dir): a broker just started rewrites every partition's
``leader-epoch-checkpoint`` for a minute or more.

``--measure-at HH:MM`` prepares every size's broker first (topics, prefill, group), stops
them with their data, and at that UTC time starts each again in turn to measure it: for a
quiet window set in advance. ``--rev REV`` runs the daemon code of REV (a branch: its tip when
the daemon starts) instead of this checkout's; ``--idle-seconds`` takes one window per size.

The load average is recorded before and after each measurement (the machine may be shared):
CPU time is the figure load distorts least. Writes ``bench/results/broker_scale.json``.
Needs root (loop mounts), Java and Maven (``make tools``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_broker_reclaim import daemon_argv, load_average  # noqa: E402
from machine import RESULTS, machine_info  # noqa: E402
from support import configs, fsfixtures  # noqa: E402
from support.disks import df_percent  # noqa: E402
from support.kafka import Target, target  # noqa: E402
from support.kafka.cluster import KafkaCluster, running_cluster  # noqa: E402
from support.kafka.node import free_port  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
GROUP = "bench-readers"
#: librdkafka's protocol debug lines (``rdkafka_request.c``/``rdkafka_broker.c``).
_SENT = re.compile(r"Sent (\w+)Request \(v(\d+), (\d+) bytes")
_RECEIVED = re.compile(r"Received (\w+)Response \(v(\d+), (\d+) bytes")


# --------------------------------------------------------------------------- the broker


def heap_mb(partitions: int) -> int:
    """A heap that holds the broker's per-partition state (measured: 320 MB is fine to a few
    thousand partitions)."""
    return max(512, min(4096, 512 + partitions // 10))


def filled_of(args: argparse.Namespace, partitions: int) -> int:
    """How many of ``partitions`` get the prefill, the group and the burst (``--filled``)."""
    return partitions if args.filled is None else min(args.filled, partitions)


def descriptors(args: argparse.Namespace, partitions: int) -> int:
    """The broker's open files at ``partitions``: one per segment's ``.log`` (the filled
    partitions' closed ones, every partition's active one), a roll per filled partition in the
    burst, and ~2,000 for its jars, sockets and the rest."""
    filled = filled_of(args, partitions)
    return filled * (args.segments + 1) + (partitions - filled) + filled + 2000


def disk_bytes(args: argparse.Namespace, partitions: int) -> int:
    """The prefill at about half the disk, with room for the bursts and the broker's own."""
    prefill = filled_of(args, partitions) * args.segments * args.segment_kib * KiB
    # Every partition, empty or not, takes its dir's block, partition.metadata and
    # leader-epoch-checkpoint (~12 KiB).
    return max(1 << 30, int(prefill * 2.2) + 512 * MiB + partitions * 32 * KiB)


def inodes(partitions: int) -> int:
    """Inodes for ``partitions`` dirs of ~6 files each, and the rolls: mkfs.ext4's default of
    one per 16 KiB ran out at 16,000 partitions on the 1 GiB disk of a small prefill."""
    return partitions * 8 + 16384


def topics_of(partitions: int, per_topic: int) -> list[tuple[str, int]]:
    full, rest = divmod(partitions, per_topic)
    out = [(f"t{i:05d}", per_topic) for i in range(full)]
    if rest:
        out.append((f"t{full:05d}", rest))
    return out


def create_topics(broker: KafkaCluster, topics: list[tuple[str, int]], segment: int) -> None:
    """Every topic, 50 to a CreateTopics request, and wait until each partition has a leader."""
    from confluent_kafka.admin import NewTopic

    admin = broker.admin()
    config = broker.segment_config(segment)
    for i in range(0, len(topics), 50):
        batch = [
            NewTopic(name, num_partitions=n, replication_factor=1, config=config)
            for name, n in topics[i : i + 50]
        ]
        for future in admin.create_topics(batch, request_timeout=120).values():
            future.result(180)
    deadline = time.monotonic() + 300
    want = dict(topics)
    while time.monotonic() < deadline:
        meta = admin.list_topics(timeout=30)
        ready = sum(
            1
            for name, n in want.items()
            if name in meta.topics
            and len(meta.topics[name].partitions) == n
            and all(p.leader >= 0 for p in meta.topics[name].partitions.values())
        )
        if ready == len(want):
            return
        time.sleep(1)
    raise RuntimeError(f"not every topic had a leader for every partition within 300 s: {ready}")


def produce_spread(
    broker: KafkaCluster,
    topics: list[tuple[str, int]],
    per_partition: int,
    record: int,
    segment: int,
) -> float:
    """``per_partition`` bytes to every partition in records of ``record`` bytes, partitions
    taken round-robin (so every partition's segments age together), in batches of at most half a
    segment (a broker refuses a batch larger than its topic's segment); returns the seconds."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **broker.client_config(),
            "linger.ms": 50,
            "batch.size": segment // 2,
            "queue.buffering.max.kbytes": 512 * 1024,
            "message.timeout.ms": 300_000,
            "compression.type": "none",
        }
    )
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    value = os.urandom(record)
    started = time.monotonic()
    for _round in range(max(1, per_partition // record)):
        for name, n in topics:
            for p in range(n):
                while True:
                    try:
                        producer.produce(name, value, partition=p, on_delivery=report)
                        break
                    except BufferError:
                        producer.poll(0.05)
        producer.poll(0)
    producer.flush(600)
    if errors:
        raise RuntimeError(f"produce: {len(errors)} errors, first {errors[0]}")
    return time.monotonic() - started


def commit_group(broker: KafkaCluster, topics: list[tuple[str, int]], offset: int) -> int:
    """``GROUP`` commits ``offset`` on every partition of every other topic; the partitions.
    A coordinator not ready yet (``__consumer_offsets`` made by the first commit, or still
    loading) is waited for, up to two minutes."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({**broker.client_config(), "group.id": GROUP, "enable.auto.commit": False})
    not_ready = {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
    try:
        offsets = [TopicPartition(name, p, offset) for name, n in topics[::2] for p in range(n)]
        deadline = time.monotonic() + 120
        for i in range(0, len(offsets), 2000):
            while True:
                try:
                    consumer.commit(offsets=offsets[i : i + 2000], asynchronous=False)
                    break
                except KafkaException as exc:
                    if exc.args[0].code() not in not_ready or time.monotonic() > deadline:
                        raise
                    time.sleep(1)
        return len(offsets)
    finally:
        consumer.close()


# --------------------------------------------------------------------------- the daemon


def write_config(
    work: Path,
    log_dir: Path,
    bootstrap: str,
    ceiling: float,
    target_pct: float,
    *,
    debug: bool,
    metrics_port: int,
    state: Path,
) -> Path:
    client = {"debug": "protocol"} if debug else {}
    return configs.write_config(
        work,
        log_dir,
        broker={"bootstrap_servers": bootstrap, "client": client},
        metrics={"listen": f"127.0.0.1:{metrics_port}"},
        logging={"format": "json", "level": "debug" if debug else "info"},
        state_dir=state,
        mode="broker",
        disk_usage_percent=ceiling,
        target_percent=target_pct,
        assume_delete_policy=None,
    )


@contextlib.contextmanager
def daemon(
    variant: str, config: Path, events: Path, work: Path
) -> Iterator[subprocess.Popen[bytes]]:
    code = Path(tempfile.mkdtemp(prefix="code-", dir=work))
    with daemon_argv(variant, code) as (argv, env), open(events, "wb") as out:
        proc = subprocess.Popen([*argv, "run", "-c", str(config)], stdout=out, stderr=out, env=env)
        try:
            deadline = time.monotonic() + 600
            while '"daemon_started"' not in events.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = events.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"the daemon did not start: {tail}")
                time.sleep(0.2)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def read_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def stamp(event: dict[str, Any]) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def requests_of(events: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """API name -> requests sent, bytes sent, responses received, bytes received."""
    out: dict[str, dict[str, int]] = {}
    for e in events:
        if e.get("event") != "librdkafka":
            continue
        message = str(e.get("message", ""))
        if m := _SENT.search(message):
            row = out.setdefault(
                m.group(1), {"sent": 0, "sent_bytes": 0, "received": 0, "received_bytes": 0}
            )
            row["sent"] += 1
            row["sent_bytes"] += int(m.group(3))
        elif m := _RECEIVED.search(message):
            row = out.setdefault(
                m.group(1), {"sent": 0, "sent_bytes": 0, "received": 0, "received_bytes": 0}
            )
            row["received"] += 1
            row["received_bytes"] += int(m.group(3))
    return dict(sorted(out.items()))


def burst(
    args: argparse.Namespace,
    broker: KafkaCluster,
    mount: Path,
    topics: list[tuple[str, int]],
    variant: str,
    work: Path,
) -> dict[str, Any]:
    """The daemon in broker mode (protocol debug), then a write burst over its ceiling."""
    partitions = sum(n for _t, n in topics)
    usage = df_percent(mount)
    ceiling = round(usage + args.burst_percent / 2, 2)
    target_pct = round(usage - args.burst_percent / 2, 2)
    config = write_config(
        work,
        broker.log_dir,
        broker.bootstrap,
        ceiling,
        target_pct,
        debug=True,
        metrics_port=free_port(),
        state=Path(tempfile.mkdtemp(prefix="state-", dir=work)),
    )
    events = work / f"burst-{variant.replace(':', '-')}.jsonl"
    load_before = load_average()
    with daemon(variant, config, events, work) as proc:
        time.sleep(args.settle)
        burst_bytes = int(args.burst_percent / 100 * disk_total(mount))
        cpu0 = psutil.Process(proc.pid).cpu_times()
        t_burst = time.time()
        produce_s = produce_spread(
            broker, topics, max(1, burst_bytes // partitions), args.record, args.segment_kib * KiB
        )
        # Until the daemon acted and then stayed quiet for a while (or gave up waiting).
        deadline = time.monotonic() + args.burst_timeout
        quiet_since = time.monotonic()
        seen = 0
        while time.monotonic() < deadline:
            acted = [
                e
                for e in read_events(events)
                if e.get("event") == "retention_cycle" and stamp(e) >= t_burst
            ]
            if len(acted) != seen:
                seen, quiet_since = len(acted), time.monotonic()
            if acted and time.monotonic() - quiet_since > args.quiet:
                break
            time.sleep(1)
        cpu1 = psutil.Process(proc.pid).cpu_times()
    lines = read_events(events)
    started = next(stamp(e) for e in lines if e.get("event") == "daemon_started")
    cycles = []
    for e in lines:
        if e.get("event") != "retention_cycle" or stamp(e) < t_burst:
            continue
        end = stamp(e)
        begin = end - float(e["duration_ms"]) / 1000
        window = [x for x in lines if begin - 0.05 <= stamp(x) <= end + 0.05]
        cycles.append(
            {
                "duration_ms": e["duration_ms"],
                "chosen_count": e["chosen_count"],
                "chosen_bytes": e["chosen_bytes"],
                "usage_before": e["usage_before"],
                "usage_after": e["usage_after"],
                "partitions_asked": len(
                    {
                        (x["topic"], x["partition"])
                        for x in window
                        if x.get("event") == "delete_records"
                    }
                ),
                "requests": requests_of(window),
            }
        )
    return {
        "variant": variant,
        "burst_partitions": partitions,
        "ceiling_percent": ceiling,
        "target_percent": target_pct,
        "usage_before_percent": round(usage, 3),
        "burst_bytes": burst_bytes,
        "produce_s": round(produce_s, 1),
        "daemon_cpu_s_from_burst": round((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system), 3),
        "cycles": cycles,
        "requests_since_started": requests_of([e for e in lines if stamp(e) >= started]),
        "segment_deleted": sum(1 for e in lines if e.get("event") == "segment_deleted"),
        "delete_failed": sum(1 for e in lines if e.get("event") == "segment_delete_failed"),
        "warnings": sorted(
            {
                str(e.get("event"))
                for e in lines
                if e.get("level") in ("warning", "error") and e.get("event") != "librdkafka"
            }
        ),
        "load_before": load_before,
        "load_after": load_average(),
    }


def disk_total(mount: Path) -> int:
    st = os.statvfs(mount)
    return st.f_blocks * st.f_frsize


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("diskguard_scan_duration_seconds_sum"):
            out["sum"] = float(line.split()[-1])
        elif line.startswith("diskguard_scan_duration_seconds_count"):
            out["count"] = float(line.split()[-1])
    return out


def idle(
    args: argparse.Namespace, broker: KafkaCluster, mount: Path, variants: list[str], work: Path
) -> list[dict[str, Any]]:
    """The daemon in broker mode with nothing to delete: CPU, RSS, cycle time. Every variant
    runs at the same time, on the same broker, measured over the same window: whatever else
    the machine does then weighs on each alike (an idle daemon takes well under 1 % of a
    core, so they hardly weigh on each other)."""
    load_before = load_average()
    with contextlib.ExitStack() as stack:
        running = []
        for variant in variants:
            port = free_port()
            config = write_config(
                work,
                broker.log_dir,
                broker.bootstrap,
                99.0,
                95.0,
                debug=False,
                metrics_port=port,
                state=Path(tempfile.mkdtemp(prefix="state-", dir=work)),
            )
            events = work / f"idle-{variant.replace(':', '-')}.jsonl"
            proc = stack.enter_context(daemon(variant, config, events, work))
            running.append((variant, port, events, psutil.Process(proc.pid)))
        time.sleep(args.idle_settle)
        m0 = [scrape(port) for _v, port, _e, _ps in running]
        c0 = [ps.cpu_times() for *_x, ps in running]
        w0 = time.monotonic()
        rss = [0] * len(running)
        while time.monotonic() - w0 < args.idle_seconds:
            for i, (*_x, ps) in enumerate(running):
                rss[i] = max(rss[i], ps.memory_info().rss)
            time.sleep(1)
        c1 = [ps.cpu_times() for *_x, ps in running]
        wall = time.monotonic() - w0
        m1 = [scrape(port) for _v, port, _e, _ps in running]
    load_after = load_average()
    out = []
    for i, (variant, _port, events, _ps) in enumerate(running):
        cpu = (c1[i].user - c0[i].user) + (c1[i].system - c0[i].system)
        cycles = m1[i].get("count", 0) - m0[i].get("count", 0)
        lines = read_events(events)
        started = next(e for e in lines if e.get("event") == "daemon_started")
        out.append(
            {
                "variant": variant,
                "mode": started.get("mode"),
                "measured_s": round(wall, 1),
                "cpu_percent": round(100 * cpu / wall, 3),
                "cpu_s": round(cpu, 3),
                "rss_mb": round(rss[i] / MiB, 1),
                "cycles": cycles,
                "cycle_mean_ms": (
                    round(1000 * (m1[i]["sum"] - m0[i]["sum"]) / cycles, 1) if cycles else None
                ),
                "load_before": load_before,
                "load_after": load_after,
            }
        )
    return out


# --------------------------------------------------------------------------- one size


def prepared(
    stack: contextlib.ExitStack, args: argparse.Namespace, kafka: Target, partitions: int
) -> tuple[dict[str, Any], KafkaCluster, Path, list[tuple[str, int]], Path]:
    """A running broker with ``partitions`` partitions prefilled and a group's offsets
    committed (its loop disk, work dirs and the broker itself closed by ``stack``); the
    result's first fields."""
    every = topics_of(partitions, args.per_topic)
    filled = filled_of(args, partitions)
    # Whole topics: the first ones up to ``filled`` partitions (the burst's and the group's).
    topics = [t for i, t in enumerate(every) if sum(n for _t, n in every[:i]) < filled]
    segment = args.segment_kib * KiB
    size = disk_bytes(args, partitions)
    result: dict[str, Any] = {
        "partitions": partitions,
        "topics": len(every),
        "filled_partitions": sum(n for _t, n in topics),
        "segment_kib": args.segment_kib,
        "disk_mib": size // MiB,
        "heap_mb": heap_mb(partitions),
        "release": str(kafka),
        "load_start": load_average(),
    }
    print(f"# {partitions} partitions: {result}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="diskguard-kafka-scale-"))
    mkfs = ["mkfs.ext4", "-q", "-F", "-m", "0", "-N", str(inodes(partitions))]
    mount = stack.enter_context(fsfixtures.loop_fs(size, mkfs, "ext4"))
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dg-bench-scale-")))
    broker = stack.enter_context(
        running_cluster(
            kafka.release,
            kafka.classpath,
            root,
            [[mount / "kafka"]],
            mode=kafka.mode,
            settings={
                "log.retention.check.interval.ms": "5000",
                "log.segment.delete.delay.ms": "500",
                "log.initial.task.delay.ms": "1000",
                "num.io.threads": "4",
            },
            heap_mb=heap_mb(partitions),
        )
    )
    t = time.monotonic()
    create_topics(broker, every, segment)
    result["create_topics_s"] = round(time.monotonic() - t, 1)
    print(f"  topics created in {result['create_topics_s']} s", flush=True)
    result["prefill_s"] = round(
        produce_spread(broker, topics, args.segments * segment, args.record, segment), 1
    )
    result["committed_partitions"] = commit_group(broker, topics, 1)
    time.sleep(2)
    result["usage_after_prefill_percent"] = round(df_percent(mount), 3)
    print(
        f"  prefilled in {result['prefill_s']} s: {result['usage_after_prefill_percent']} %",
        flush=True,
    )
    return result, broker, mount, topics, work


def at_rest(log_dir: Path, quiet_s: float, timeout_s: float = 900.0) -> float:
    """Wait until no partition dir of ``log_dir`` has had an event for ``quiet_s`` (the
    KRaft metadata log's appends and the log dir's own checkpoints aside: a broker at rest
    writes those forever); returns the seconds waited. A broker just (re)started rewrites
    every partition's ``leader-epoch-checkpoint`` as it takes leadership, for minutes on a
    loaded machine: an idle daemon measured meanwhile measures that, not rest."""
    from inotify_simple import INotify
    from inotify_simple import flags as f

    mask = f.CREATE | f.DELETE | f.MOVED_FROM | f.MOVED_TO | f.MODIFY | f.CLOSE_WRITE
    started = time.monotonic()
    with INotify() as ino:
        for entry in os.scandir(log_dir):
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("__cluster"):
                ino.add_watch(entry.path, mask)
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            if time.monotonic() - started > timeout_s:
                break
            if ino.read(timeout=1000):
                last = time.monotonic()
    return round(time.monotonic() - started, 1)


def measured(
    args: argparse.Namespace,
    result: dict[str, Any],
    broker: KafkaCluster,
    mount: Path,
    topics: list[tuple[str, int]],
    work: Path,
) -> dict[str, Any]:
    """The burst and the idle measurements on a prepared broker, into ``result``."""
    args.idle_seconds = args.idle_windows[result["partitions"]]
    this = f"predictive@{args.rev}" if args.rev else "predictive"
    variants = [this] + ([f"baseline:{args.baseline}"] if args.baseline else [])
    result["burst"] = []
    result["idle"] = []
    result["broker_rest_s"] = at_rest(broker.log_dir, args.broker_rest)
    print(f"  broker at rest after {result['broker_rest_s']} s", flush=True)
    for variant in variants if args.only in (None, "burst") else ():
        res = burst(args, broker, mount, topics, variant, work)
        print(json.dumps(summary_of_burst(res)), flush=True)
        result["burst"].append(res)
        # The broker removes what it was asked to at its next retention check.
        time.sleep(8)
    if args.only in (None, "idle"):
        for res in idle(args, broker, mount, variants, work):
            print(json.dumps(res), flush=True)
            result["idle"].append(res)
    result["broker_log_errors"] = [
        line for line in broker.log_text().splitlines() if " ERROR " in line
    ][:20]
    return result


def one_size(args: argparse.Namespace, kafka: Target, partitions: int) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        return measured(args, *prepared(stack, args, kafka, partitions))


def at_a_time(args: argparse.Namespace, kafka: Target, sizes: list[int]) -> list[dict[str, Any]]:
    """``--measure-at``: every size's broker prepared now, then stopped (its data kept); at
    the time given (UTC), each started again in turn, measured, stopped. For a quiet window
    set in advance: what takes long (topics, prefill) is done before it."""
    hour, minute, *sec = (int(x) for x in args.measure_at.split(":"))
    now = time.time()
    at = now - now % 86400 + hour * 3600 + minute * 60 + (sec[0] if sec else 0)
    if at < now:
        at += 86400
    results = []
    with contextlib.ExitStack() as stack:
        ready = []
        for n in sizes:
            result, broker, mount, topics, work = prepared(stack, args, kafka, n)
            broker.stop()
            ready.append((result, broker, mount, topics, work))
        print(f"# prepared; measuring at {args.measure_at} UTC", flush=True)
        time.sleep(max(0.0, at - time.time()))
        for result, broker, mount, topics, work in ready:
            t = time.monotonic()
            broker.start()
            broker.wait_brokers()
            result["restart_s"] = round(time.monotonic() - t, 1)
            result["measured_at"] = time.strftime("%H:%M:%S", time.gmtime())
            print(f"# {result['partitions']}: broker up in {result['restart_s']} s", flush=True)
            results.append(measured(args, result, broker, mount, topics, work))
            broker.stop()
    return results


def summary_of_burst(res: dict[str, Any]) -> dict[str, Any]:
    return {
        "variant": res["variant"],
        "burst_partitions": res["burst_partitions"],
        "cycles": [
            {
                "ms": c["duration_ms"],
                "chosen": c["chosen_count"],
                "partitions_asked": c["partitions_asked"],
                "requests": {k: v["sent"] for k, v in c["requests"].items()},
            }
            for c in res["cycles"]
        ],
        "load": [res["load_before"], res["load_after"]],
    }


def _raise_open_files() -> int:
    """The open-files limit raised to 1,048,576 where allowed, else to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for wanted in ((1 << 20, 1 << 20), (hard, hard)):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, wanted)
            return wanted[0]
    return soft


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", help="Kafka release (default: DISKGUARD_KAFKA_* or newest 4.x)")
    ap.add_argument("--mode", choices=("kraft", "zk"))
    ap.add_argument("--partitions", default="500,5000", help="comma-separated sizes")
    ap.add_argument("--per-topic", type=int, default=50)
    ap.add_argument("--segments", type=int, default=3, help="closed segments per partition")
    ap.add_argument(
        "--filled",
        type=int,
        help="partitions prefilled, committed and burst (whole topics from the first; default"
        " all): the rest stay empty",
    )
    ap.add_argument("--segment-kib", type=int, default=64)
    ap.add_argument("--record", type=int, default=4 * KiB)
    ap.add_argument("--burst-percent", type=float, default=4.0)
    ap.add_argument("--burst-timeout", type=float, default=180.0)
    ap.add_argument("--quiet", type=float, default=15.0, help="s without a cycle that acted")
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument(
        "--idle-seconds",
        default="60",
        help="the idle window, s; comma-separated: one per size (the last for the rest)",
    )
    ap.add_argument("--idle-settle", type=float, default=20.0)
    ap.add_argument(
        "--broker-rest",
        type=float,
        default=30.0,
        help="before measuring, s without an event in any partition dir (0: do not wait)",
    )
    ap.add_argument("--baseline", metavar="REV", help="also run the daemon code of REV")
    ap.add_argument(
        "--rev",
        help="the daemon code of REV instead of this checkout's (a branch: its tip when the"
        " daemon starts)",
    )
    ap.add_argument("--only", choices=("burst", "idle"), help="run one of the two measurements")
    ap.add_argument(
        "--measure-at",
        metavar="HH:MM[:SS]",
        help="prepare every size's broker now, stop it, measure each at this UTC time",
    )
    ap.add_argument("--out", default=str(RESULTS / "broker_scale.json"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_broker_scale needs root (loop mounts)", file=sys.stderr)
        return 2
    # A broker keeps a descriptor open per segment's .log: 5,000 partitions of 4 segments
    # outgrow a limit of 20,000 ("Too many open files", the log dir taken offline). Kafka's
    # advice is 100,000 or more; the broker inherits this process's limit, raised as far as
    # this process may (a container without CAP_SYS_RESOURCE: to its hard limit).
    nofile = _raise_open_files()
    kafka = target(args.release, args.mode)
    sizes = [int(x) for x in args.partitions.split(",") if x]
    for n in sizes:
        if descriptors(args, n) > nofile:
            print(
                f"# {n} partitions ({filled_of(args, n)} filled) x {args.segments + 1} segments:"
                f" more open files than the limit ({nofile}); the broker will take its log dir"
                " offline (--segments, --filled)",
                file=sys.stderr,
            )
    print(f"# {kafka}, load {load_average()}", flush=True)
    windows = [float(x) for x in str(args.idle_seconds).split(",") if x]
    args.idle_windows = {n: windows[min(i, len(windows) - 1)] for i, n in enumerate(sizes)}
    if args.measure_at:
        results = at_a_time(args, kafka, sizes)
    else:
        results = [one_size(args, kafka, n) for n in sizes]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine_info(), "results": results}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
