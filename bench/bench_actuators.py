"""What does each flow-control actuator let through once a disk is overfull?

A real three-broker cluster (``support.kafka.guarded``: each broker on its own loop ext4,
SASL/PLAIN, the release's ACL authorizer, permissive where no ACL is found) and one
``diskguard run`` beside broker 1. A fleet of producers (threads, one librdkafka producer
each, ``acks=all``, 1 KiB records, 256 KiB/s each) writes into one topic
(6 partitions, replication factor 3: every broker's disk takes every record). A filler then
makes broker 1's disk overfull. Per variant, one after another on the same cluster:
- ``none`` (baseline): no actuator, nothing holds producers back;
- ``acl``: a DENY WRITE for ``User:*`` on the topics of that disk;
- ``quota``: ``producer_byte_rate`` 1 KiB/s for the default user and client id;
- ``acl+quota``: both;
- ``exec``: the ``on_change`` hook, here a script that raises (on ``overfull``) and lowers
  (on ``overfull_cleared``) a flag file the producers look at before each record: a fleet
  that cooperates, as an operator's hook that pauses producer jobs or flips a feature flag
  makes one. What it measures is the hook's own path (the daemon's transition, fork and exec
  of the script, the producers noticing) plus what was already in flight; a hook that
  reaches no producer holds back nothing (the baseline).
Reported per variant: bytes the fleet got
acknowledged after the guard's ``overfull`` event within ``--window`` seconds, when the last
of them was acknowledged (seconds after ``overfull``), the sends that failed after it (by
Kafka error name), the guard's ``actuator_failed`` events, and the acknowledged rate before.
``--repeats`` runs every variant that many times, in rounds (each round every variant once),
so that the machine's load drifts over all of them alike.

Each variant also checks the release: an operator's own quota (``OPERATOR_QUOTA``, on the
very entity the ``quota`` actuator throttles) is in place before, and after
``overfull_cleared`` the cluster's ACLs and client quotas must come back exactly as they were
(reported: how long that took, or what was left behind).
Writes ``bench/results/actuators.json`` and prints the table for docs/flow-control.md.
Not part of the test suite; needs root (loop mounts), Java and Maven. Timing depends on the
machine's load (printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from machine import machine_info  # noqa: E402
from support import fsfixtures  # noqa: E402
from support.daemonproc import DaemonProc  # noqa: E402
from support.disks import df_percent  # noqa: E402
from support.kafka import target  # noqa: E402
from support.kafka.broker import acl_settings, fast_retention  # noqa: E402
from support.kafka.guarded import DISK_BYTES, GuardedCluster, guarded_cluster  # noqa: E402

RESULTS = ROOT / "bench" / "results"
RECORD = 1024
MiB = 1024 * 1024
#: Each producer's pace (bytes/s): the fleet writes fast, but not faster than the brokers'
#: own retention frees, and the 2 cores keep the guard scheduled.
PACE = 256 * 1024
TOPIC = "fleet"
#: The operator's own default-user producer quota (never limiting the fleet's ~1 MiB/s;
#: Kafka 4.x refuses a fractional rate);
#: the ``quota`` actuator must put exactly this value back.
OPERATOR_QUOTA = (("user", None),), 50_000_000.0
VARIANTS: dict[str, list[str]] = {
    "none": [],
    "acl": ["acl"],
    "quota": ["quota"],
    "acl+quota": ["acl", "quota"],
    "exec": ["exec"],
}
#: The ``exec`` variant's hook: the flag is the fleet's "stop producing" switch.
HOOK = """#!/bin/sh
case "$DISKGUARD_EVENT" in
  overfull) : > "$1" ;;
  overfull_cleared) rm -f "$1" ;;
esac
"""


@dataclass
class Result:
    variant: str
    release: str
    producers: int
    rate_before_bytes_per_s: float
    bytes_after_overfull: int
    last_ack_after_overfull_s: float | None
    window_s: float
    errors_after_overfull: int
    load_before: str
    load_after: str
    round: int = 1
    #: Seconds after ``overfull_cleared`` until ACLs and quotas were exactly as before.
    restored_after_clear_s: float | None = None
    #: What was still different 60 s after ``overfull_cleared`` (empty: nothing).
    left_behind: str = ""
    #: The failed sends after ``overfull`` by Kafka error name (``refused at send``: the
    #: client refused the record itself, its metadata saying the topic is denied).
    error_names: dict[str, int] = field(default_factory=dict)
    #: The guard's ``actuator_failed`` events (action: error), none expected.
    actuator_failed: list[str] = field(default_factory=list)


class Fleet:
    """``n`` producer threads writing 1 KiB records with ``acks=all``; every acknowledgement
    (and error) with its time."""

    def __init__(self, cluster: GuardedCluster, n: int, paused: Path | None = None) -> None:
        self.acks: list[float] = []
        #: While this file exists the producers send nothing (the ``exec`` hook's switch).
        self.paused = paused
        self.errors: list[float] = []
        self.error_names: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(cluster,), daemon=True) for _ in range(n)
        ]

    def _run(self, cluster: GuardedCluster) -> None:
        from confluent_kafka import KafkaException, Producer

        producer = Producer(
            {
                **cluster.client("producer"),
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 10_000,
                "queue.buffering.max.messages": 2000,
            }
        )

        def report(err: Any, _msg: Any) -> None:
            with self._lock:
                now = time.monotonic()
                (self.acks if err is None else self.errors).append(now)
                if err is not None:
                    name = err.name() if hasattr(err, "name") else "refused at send"
                    self.error_names.append((now, name))

        payload = os.urandom(RECORD)
        next_at = time.monotonic()
        while not self._stop.is_set():
            if self.paused is not None and self.paused.exists():
                producer.poll(0.05)
                next_at = time.monotonic()
                continue
            try:
                producer.produce(TOPIC, payload, on_delivery=report)
            except BufferError:
                producer.poll(0.05)
                continue
            except KafkaException:  # refused at once (the topic's metadata says denied)
                report(True, None)
                producer.poll(0.05)
                continue
            next_at += RECORD / PACE
            producer.poll(max(0.0, next_at - time.monotonic()))
        producer.flush(15)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def left_behind(cluster: GuardedCluster, acls: set[tuple[str, ...]], quotas: dict[Any, Any]) -> str:
    """What differs from ``acls``/``quotas`` now (empty when the cluster is as it was)."""
    now_acls, now_quotas = cluster.acls(), cluster.quotas()
    parts = []
    if now_acls - acls:
        parts.append(f"ACLs added: {sorted(now_acls - acls)}")
    if acls - now_acls:
        parts.append(f"ACLs gone: {sorted(acls - now_acls)}")
    if now_quotas != quotas:
        parts.append(f"quotas {now_quotas} (before {quotas})")
    return "; ".join(parts)


def measure(
    cluster: GuardedCluster,
    workdir: Path,
    variant: str,
    producers: int,
    window: float,
    round_: int = 1,
) -> Result:
    now = df_percent(cluster.mount(1))
    flow: dict[str, Any] = {
        # The topic itself holds up to ~30 MiB (12 % of a disk): below underfull either way.
        "overfull_percent": round(now + 25, 2),
        "underfull_percent": round(now + 15, 2),
        "min_free_bytes": "1MiB",
        "actuators": VARIANTS[variant],
    }
    paused = None
    if variant == "exec":
        hook = workdir / "hold-producers.sh"
        hook.parent.mkdir(parents=True, exist_ok=True)
        hook.write_text(HOOK)
        hook.chmod(0o755)
        paused = workdir / "producers-paused"
        flow["on_change"] = [str(hook), str(paused)]
    config = cluster.guard_config(
        workdir / f"{variant}-{round_}", 1, flow_control=flow, mode="dry-run"
    )
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    with cluster.as_it_was() as (acls, quotas), DaemonProc(config) as guard:
        guard.wait_for("daemon_started", timeout=120)
        fleet = Fleet(cluster, producers, paused)
        fleet.start()
        try:
            time.sleep(5)
            cluster.fill(1, 0.35)
            overfull = guard.wait_for("overfull", timeout=60)["_t"]
            time.sleep(window)
        finally:
            fleet.stop()
        before = [t for t in fleet.acks if overfull - 4 <= t < overfull]
        after = [t for t in fleet.acks if overfull <= t <= overfull + window]
        cluster.clear(1)
        cleared = guard.wait_for("overfull_cleared", timeout=60)["_t"]
        restored = None
        while True:
            left = left_behind(cluster, acls, quotas)
            if not left:
                restored = round(time.monotonic() - cleared, 2)
                break
            if time.monotonic() > cleared + 60:
                break
            time.sleep(0.5)
        failed = [f"{e.get('action')}: {e.get('error')}" for e in guard.named("actuator_failed")]
        assert guard.stop() == 0
    return Result(
        variant=variant,
        release=cluster.cluster.release.text,
        producers=producers,
        rate_before_bytes_per_s=round(len(before) * RECORD / 4, 1),
        bytes_after_overfull=len(after) * RECORD,
        last_ack_after_overfull_s=round(max(after) - overfull, 2) if after else None,
        window_s=window,
        errors_after_overfull=sum(1 for t in fleet.errors if t >= overfull),
        error_names=dict(Counter(name for t, name in fleet.error_names if t >= overfull)),
        actuator_failed=failed,
        load_before=load_before,
        load_after=" ".join(f"{x:.1f}" for x in os.getloadavg()),
        round=round_,
        restored_after_clear_s=restored,
        left_behind=left,
    )


def table(results: list[Result]) -> str:
    lines = [
        "| round | actuator | acknowledged after `overfull` | last ack after `overfull` |"
        " failed sends | as before after `overfull_cleared` | load before → after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        last = "—" if r.last_ack_after_overfull_s is None else f"{r.last_ack_after_overfull_s} s"
        restored = (
            f"yes, {r.restored_after_clear_s} s"
            if r.restored_after_clear_s is not None
            else f"NO: {r.left_behind}"
        )
        lines.append(
            f"| {r.round} | {r.variant} | {r.bytes_after_overfull / 1e6:.2f} MB in "
            f"{r.window_s:.0f} s | {last} | {r.errors_after_overfull} | {restored} | "
            f"{r.load_before} → {r.load_after} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    kafka = target()
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        mounts = [
            stack.enter_context(fsfixtures.loop_ext4(DISK_BYTES, 0, name=f"broker-{i}"))
            for i in (1, 2, 3)
        ]
        root = Path(tempfile.mkdtemp(prefix="diskguard-bench-actuators-"))
        stack.callback(shutil.rmtree, root, True)
        cluster = stack.enter_context(
            guarded_cluster(
                kafka.release,
                kafka.classpath,
                kafka.mode,
                root,
                mounts,
                acl_settings(kafka.release, kafka.mode) | fast_retention(kafka.release),
            )
        )
        # Each partition keeps at most 4 MiB: the fleet never fills a 256 MiB disk itself.
        cluster.cluster.create_topic(
            TOPIC, 6, 3, **cluster.cluster.segment_config(MiB), **{"retention.bytes": str(4 * MiB)}
        )
        workdir = Path(tempfile.mkdtemp(prefix="diskguard-bench-guards-"))
        stack.callback(shutil.rmtree, workdir, True)
        entity, rate = OPERATOR_QUOTA
        cluster.set_quota(dict(entity), rate)
        for round_ in range(1, args.repeats + 1):
            for variant in args.variants.split(","):
                result = measure(cluster, workdir, variant, args.producers, args.window, round_)
                print(json.dumps(asdict(result)), flush=True)
                results.append(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"machine": machine_info(), "results": [asdict(r) for r in results]}
    (RESULTS / "actuators.json").write_text(json.dumps(out, indent=2) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
