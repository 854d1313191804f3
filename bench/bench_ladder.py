"""Does the ladder hold the ceiling under a write burst with no record lost, while it has room?

A real Kafka broker with tiered storage (Kafka's ``LocalTieredStorage``; ``support.kafka.tiered``:
4.3.1 for a 4.4 run) and two log dirs on two loop ext4 filesystems (JBOD): every partition
starts in dir A (dir B cordoned while the topics are made), dir B is empty. A writer bursts
into a tiered topic and a plain one, more than dir A can hold. ``diskguard run`` guards both
dirs in broker mode. Variants, one after another on a fresh broker each:

- ``ladder``: this checkout: evict what tiered storage uploaded, move plain replicas to B,
  delete only what is left;
- ``delete-only`` (baseline): the same daemon with the lossless rungs off
  (``ladder.tiered_eviction/balance_log_dirs/cordon = false``): KIP-61 deletion as before
  the ladder (tiered topics protected, plain ones trimmed).

Reported per variant: each dir's peak usage and seconds over its ceiling (df every 100 ms),
records delivered and records a consumer reads back from offset 0 per topic (lost = the
difference), the rung actions (evictions, moves, deletions) and the load average before and
after (the machine may be shared). Writes ``bench/results/ladder.json``. Not part of the
test suite; needs root (loop mounts), Java and Maven.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from machine import load_average, machine_info  # noqa: E402
from support import fsfixtures  # noqa: E402
from support.disks import df_percent  # noqa: E402
from support.kafka import target  # noqa: E402
from support.kafka.broker import fast_retention  # noqa: E402
from support.kafka.classpath import Release  # noqa: E402
from support.kafka.cluster import KafkaCluster, running_cluster  # noqa: E402
from support.kafka.node import hand_to_user  # noqa: E402
from support.kafka.tiered import tiered_release, tiered_settings  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MiB = 1024 * 1024
RECORD = 8192
TOPICS = {"tiered": 2, "plain": 4}
OFF = {"tiered_eviction": False, "balance_log_dirs": False, "cordon": False}


@dataclass
class Result:
    variant: str
    release: str
    ceiling: float
    target: float
    peak_a: float
    peak_b: float
    seconds_over_a: float
    seconds_over_b: float
    delivered: dict[str, int]
    read_back: dict[str, int]
    lost: int
    evictions: int
    moves: int
    deletions: int
    #: Bytes per rung, from the daemon's own events: evicted = local copies the broker was
    #: asked to drop (already uploaded), moved = replicas moved whole to dir B, deleted =
    #: segments deleted (DeleteRecords).
    evicted_bytes: int
    moved_bytes: int
    deleted_bytes: int
    load_before: str
    load_after: str
    notes: list[str] = field(default_factory=list)


class Burst(threading.Thread):
    """``rate`` bytes a second for ``seconds``, split over the topics by partition count;
    counts what the broker acknowledged."""

    def __init__(self, bootstrap: str, rate: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.rate, self.seconds = bootstrap, rate, seconds
        self.delivered = dict.fromkeys(TOPICS, 0)
        self.failed = 0

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 5,
                "batch.size": 262144,
                "message.timeout.ms": 120_000,
                "log_level": 0,
            }
        )

        def report(err: Any, msg: Any) -> None:
            if err is None:
                self.delivered[msg.topic()] += 1
            else:
                self.failed += 1

        payload = os.urandom(RECORD)
        cycle = [t for t, n in TOPICS.items() for _ in range(n)]
        start, sent = time.monotonic(), 0
        while (now := time.monotonic() - start) < self.seconds:
            while sent < now * self.rate:
                topic = cycle[(sent // RECORD) % len(cycle)]
                try:
                    producer.produce(topic, payload, on_delivery=report)
                    sent += RECORD
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            time.sleep(0.01)
        producer.flush(120)


def cordon(broker: KafkaCluster, path: Path, add: bool) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    op = AlterConfigOpType.APPEND if add else AlterConfigOpType.SUBTRACT
    entry = ConfigEntry("cordoned.log.dirs", str(path), incremental_operation=op)
    admin = broker.admin()
    resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)


def config_text(dirs: list[Path], bootstrap: str, state: Path, args: Any, variant: str) -> str:
    ladder = "" if variant == "ladder" else "".join(f"{k} = false\n" for k in OFF)
    return (
        f"[broker]\nlog_dirs = {json.dumps([str(d) for d in dirs])}\n"
        f'bootstrap_servers = "{bootstrap}"\n'
        f"[retention]\ndisk_usage_percent = {args.ceiling}\ntarget_percent = {args.target}\n"
        'mode = "broker"\ncheck_interval = "2s"\n'
        f"[ladder]\n{ladder}"
        # Alert level 1 two points under the ceiling: dir A is cordoned during the burst;
        # B, filled by moves only up to its target, never is (a cordoned dir takes no move).
        f"[alerts]\nlow_space_percent = {args.ceiling - 2}\n"
        f'[daemon]\nstate_dir = "{state}"\n[logging]\nlevel = "info"\n'
    )


def run_variant(release: Release, jars: tuple[Path, ...], variant: str, args: Any) -> Result:
    load_before = load_average()
    with (
        tempfile.TemporaryDirectory(prefix="dg-ladder-") as tmp,
        fsfixtures.loop_ext4(args.disk_mib * MiB, 0, name="ladder-a") as mount_a,
        fsfixtures.loop_ext4(args.disk_mib * MiB, 0, name="ladder-b") as mount_b,
    ):
        work = Path(tmp)
        os.chmod(work, 0o755)
        remote = work / "remote"
        remote.mkdir()
        hand_to_user(remote)
        a, b = mount_a / "kafka-logs", mount_b / "kafka-logs"
        settings = fast_retention(release) | tiered_settings(remote)
        with running_cluster(release, jars, work / "c", [[a, b]], settings=settings) as broker:
            cordon(broker, b, add=True)  # every partition starts in A
            time.sleep(1.0)
            segment = broker.segment_config(MiB)
            broker.create_topic(
                "tiered", TOPICS["tiered"], **segment, **{"remote.storage.enable": "true"}
            )
            broker.create_topic("plain", TOPICS["plain"], **segment)
            cordon(broker, b, add=False)
            cfg, state, events = work / "diskguard.toml", work / "state", work / "events.jsonl"
            cfg.write_text(config_text([a, b], broker.bootstrap, state, args, variant))
            with open(events, "w") as out:
                daemon = subprocess.Popen(
                    [sys.executable, "-m", "diskguard", "run", "-c", str(cfg)],
                    stdout=out,
                    stderr=out,
                )
                try:
                    deadline = time.monotonic() + 120
                    while '"daemon_started"' not in events.read_text():
                        if daemon.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(events.read_text()[-2000:])
                        time.sleep(0.2)
                    burst = Burst(broker.bootstrap, args.rate_mib * MiB, args.seconds)
                    samples = sample(burst, mount_a, mount_b, args.seconds + args.settle)
                finally:
                    daemon.terminate()
                    daemon.wait(30)
            delivered = dict(burst.delivered)
            back = {t: broker.read_all(t, n, timeout=300) for t, n in delivered.items()}
        lines = [json.loads(x) for x in events.read_text().splitlines() if x.startswith("{")]
    names = [e.get("event") for e in lines]
    notes = [f"{burst.failed} records not acknowledged"] if burst.failed else []
    return Result(
        variant=variant,
        release=str(release),
        ceiling=args.ceiling,
        target=args.target,
        peak_a=round(max(p for _t, p, _q in samples), 2),
        peak_b=round(max(q for _t, _p, q in samples), 2),
        seconds_over_a=round(sum(0.1 for _t, p, _q in samples if p > args.ceiling), 1),
        seconds_over_b=round(sum(0.1 for _t, _p, q in samples if q > args.ceiling), 1),
        delivered=delivered,
        read_back=back,
        lost=sum(delivered.values()) - sum(back.values()),
        evictions=names.count("tiered_eviction"),
        moves=names.count("replica_move_started"),
        deletions=names.count("segment_deleted"),
        evicted_bytes=event_bytes(lines, "tiered_eviction"),
        moved_bytes=event_bytes(lines, "replica_move_done"),
        deleted_bytes=event_bytes(lines, "segment_deleted"),
        load_before=load_before,
        load_after=load_average(),
        notes=notes,
    )


def event_bytes(lines: list[dict[str, Any]], name: str) -> int:
    return sum(int(e.get("bytes") or 0) for e in lines if e.get("event") == name)


def sample(burst: Burst, a: Path, b: Path, seconds: float) -> list[tuple[float, float, float]]:
    start = time.monotonic()
    burst.start()
    out = []
    while (now := time.monotonic() - start) < seconds:
        out.append((round(now, 2), round(df_percent(a), 3), round(df_percent(b), 3)))
        time.sleep(0.1)
    burst.join(180)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", help="Kafka release (default: DISKGUARD_KAFKA_* or newest)")
    ap.add_argument("--variants", default="ladder,delete-only")
    ap.add_argument("--disk-mib", type=int, default=256)
    ap.add_argument("--rate-mib", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=50.0)
    ap.add_argument("--settle", type=float, default=20.0)
    ap.add_argument("--ceiling", type=float, default=60.0)
    ap.add_argument("--target", type=float, default=50.0)
    ap.add_argument("--out", default=str(RESULTS / "ladder.json"))
    args = ap.parse_args(argv)
    found = tiered_release(target(args.release, "kraft").release)
    if isinstance(found, str):
        ap.error(found)
    release, jars = found
    print(f"# {release} (tiered + JBOD), load {load_average()}", flush=True)
    results = []
    for variant in args.variants.split(","):
        res = run_variant(release, jars, variant, args)
        print(json.dumps(asdict(res)), flush=True)
        results.append(asdict(res))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine_info(), "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
