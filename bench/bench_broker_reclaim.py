"""Does the KIP-61 ceiling hold in broker mode beside a real Kafka broker, and does the
forecast delete only for growth that comes?

A real Apache Kafka broker (the project's harness, ``tests/support/kafka``: ``--release``,
default the newest 4.x in KRaft mode; ``DISKGUARD_KAFKA_HOME`` still picks a distribution
directory) runs as ``nobody`` with its log dir on a fresh loop ext4 (no root reserve);
``diskguard run`` guards it in broker mode (DeleteRecords). Usage is sampled as df computes
it every 100 ms. Per scenario, the variants run one after another in the same session:

- ``predictive``: diskguard as in this checkout (growth rate x the broker's reclaim latency);
- ``reactive`` (baseline): the same daemon with the forecast switched off, i.e. asking only
  once the disk is over its ceiling, as the first release did;
- ``baseline:REV`` (``--baseline REV``): the daemon code of git revision REV;
- ``predictive@REV``, ``reactive@REV``: either, with the daemon code of REV (``--at REV``
  pins every variant so: edits made while a long run goes on do not change it).

Scenarios: a steady writer with 15 s and 1 s retention checks; Kafka's default checks
(300 s + 60 s delete delay), where the headroom cannot absorb the growth and
``broker_reclaim_slow`` must speak; a steady writer that stops; one-off writes that leave the
disk under its ceiling (with the daemon running a while, and right after its start).

Reported per run: peak, seconds over the ceiling, the lowest usage once settled (after the
first DeleteRecords plus two check periods) and after the writer stopped or the one-off write,
bytes the broker was asked to delete, ``broker_reclaim_slow`` and ``overfull`` events, and the
load average before and after (the machine may be shared). Writes
``bench/results/broker_reclaim.json``. Not part of the test suite; needs root (loop mount),
Java and Maven (or a distribution).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from machine import load_average, machine_info  # noqa: E402
from support import fsfixtures  # noqa: E402
from support.disks import df_percent  # noqa: E402
from support.kafka import Target, target  # noqa: E402
from support.kafka.cluster import KafkaCluster, running_broker  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MiB = 1024 * 1024
#: The baseline: the daemon as it was, with no growth forecast (asks once over the ceiling).
REACTIVE = (
    "import diskguard.retention.forecaster as f\n"
    "from diskguard.retention.reclaim import Forecast\n"
    "f.Forecaster.growth_rate = lambda self, mount: None\n"
    "f.Forecaster.forecast = lambda self, mount: Forecast()\n"
    "from diskguard.cli import main\n"
    "main()\n"
)


@dataclass(frozen=True)
class Scenario:
    """One run's broker settings, disk, writers and limits.

    ``check_ms``/``delay_ms`` None: Kafka's default (300 s / 60 s, not set at all), and the
    first check ``log.initial.task.delay.ms`` (30 s) after start-up, as on 2.2. ``rate_mib``:
    a steady writer from t=0 (MiB/s) until ``stop_s``; ``oneoff``: (t, MiB) writes at full
    speed; ``prefill_mib``: written before the daemon starts; ``filler_mib``: a plain file (not
    Kafka data) on the disk before anything else.
    """

    name: str
    check_ms: int | None
    delay_ms: int | None
    rate_mib: float
    ceiling: float
    target: float
    seconds: float
    disk_mib: int = 384
    stop_s: float | None = None
    oneoff: tuple[tuple[float, float], ...] = ()
    prefill_mib: float = 0.0
    filler_mib: int = 0
    #: flow_control limits (overfull, underfull): an ``overfull`` event counts as engaged.
    flow: tuple[float, float] | None = None

    @property
    def period_s(self) -> float:
        return (self.check_ms if self.check_ms is not None else 300_000) / 1000

    def broker_settings(self) -> dict[str, str]:
        settings = {"num.partitions": "4"}
        if self.check_ms is not None:
            settings["log.retention.check.interval.ms"] = str(self.check_ms)
        if self.delay_ms is not None:
            settings["log.segment.delete.delay.ms"] = str(self.delay_ms)
        return settings


@dataclass
class Result:
    scenario: str
    variant: str
    release: str
    peak_percent: float
    seconds_over_ceiling: float
    trough_percent: float | None
    #: Lowest usage after the writer stopped / after the one-off write landed (its peak).
    trough_after_percent: float | None
    deletions: int
    deleted_bytes: int
    first_deletion_s: float | None
    reclaim_slow_s: float | None
    overfull_events: int
    ceiling: float
    target: float
    load_before: str
    load_after: str
    notes: list[str] = field(default_factory=list)


class Writer(threading.Thread):
    """A confluent-kafka producer of 16 KiB records: a steady rate from ``start`` until
    ``stop_s`` (or the end), plus one-off writes of ``MiB`` at full speed at given times."""

    def __init__(self, bootstrap: str, topic: str, sc: Scenario, start: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.sc, self.start_t = bootstrap, topic, sc, start
        self.stop_event = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 5,
                "batch.size": 262144,
                "compression.type": "none",
                "log_level": 0,
            }
        )
        payload = os.urandom(16384)
        rate = self.sc.rate_mib * MiB
        pending = sorted(self.sc.oneoff)
        sent = 0
        while not self.stop_event.is_set():
            now = time.monotonic() - self.start_t
            if pending and now >= pending[0][0]:
                _at, mib = pending.pop(0)
                send(producer, self.topic, payload, int(mib * MiB))
            until = now if self.sc.stop_s is None else min(now, self.sc.stop_s)
            while sent < until * rate:
                send(producer, self.topic, payload, len(payload))
                sent += len(payload)
            producer.poll(0)
            time.sleep(0.01)
        producer.flush(10)


def send(producer: Any, topic: str, payload: bytes, size: int) -> None:
    done = 0
    while done < size:
        try:
            producer.produce(topic, payload)
            done += len(payload)
        except BufferError:
            producer.poll(0.05)
    producer.poll(0)


@contextlib.contextmanager
def daemon_argv(variant: str, work: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The command line and environment of ``variant``: ``predictive`` or ``reactive``, of this
    checkout or, with ``@REV``, of the daemon code of git revision REV (exported with ``git
    archive``: a run is not changed by edits made while it goes on); ``baseline:REV`` is
    ``predictive@REV``."""
    if variant.startswith("baseline:"):
        variant = "predictive@" + variant.split(":", 1)[1]
    kind, _, rev = variant.partition("@")
    env = dict(os.environ)
    if rev:
        into = work / "code"
        into.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "daemon"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
        env["PYTHONPATH"] = str(into / "daemon")
    if kind == "predictive":
        yield [sys.executable, "-m", "diskguard"], env
    elif kind == "reactive":
        yield [sys.executable, "-c", REACTIVE], env
    else:
        raise ValueError(f"unknown variant {variant!r}")


def write_config(path: Path, sc: Scenario, log_dir: Path, bootstrap: str, state: Path) -> None:
    text = (
        f'[broker]\nlog_dirs = ["{log_dir}"]\nbootstrap_servers = "{bootstrap}"\n'
        f"[retention]\ndisk_usage_percent = {sc.ceiling}\ntarget_percent = {sc.target}\n"
        'mode = "broker"\ncheck_interval = "5s"\n'
    )
    if sc.flow is not None:
        text += f"[flow_control]\noverfull_percent = {sc.flow[0]}\n"
        text += f"underfull_percent = {sc.flow[1]}\n"
    text += f'[daemon]\nstate_dir = "{state}"\n[logging]\nlevel = "info"\n'
    path.write_text(text)


def run_one(kafka: Target, sc: Scenario, variant: str, keep: Path | None = None) -> Result:
    load_before = load_average()
    with (
        fsfixtures.loop_ext4(sc.disk_mib * MiB, 0) as mount,
        tempfile.TemporaryDirectory(prefix="dg-bench-") as tmp,
    ):
        work = Path(tmp)
        if sc.filler_mib:
            fsfixtures.fill(mount / "filler", sc.filler_mib * MiB)
        log_dir = mount / "kafka"
        with running_broker(
            kafka.release,
            kafka.classpath,
            log_dir,
            mode=kafka.mode,
            settings=sc.broker_settings(),
        ) as broker:
            broker.create_topic("load", 4, **{"segment.bytes": str(MiB)})
            if sc.prefill_mib:
                prefill(broker, sc.prefill_mib)
            cfg, state, events = work / "diskguard.toml", work / "state", work / "events.jsonl"
            write_config(cfg, sc, log_dir, broker.bootstrap, state)
            with daemon_argv(variant, work) as (argv, env), open(events, "w") as out:
                daemon = subprocess.Popen(
                    [*argv, "run", "-c", str(cfg)], stdout=out, stderr=out, env=env
                )
                try:
                    wait_started(events, daemon)
                    samples, start_wall = sample(broker, sc, mount)
                finally:
                    daemon.terminate()
                    daemon.wait(30)
            text = events.read_text()
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                stem = f"{sc.name}-{variant.replace(':', '-')}"
                (keep / f"{stem}-events.jsonl").write_text(text)
                (keep / f"{stem}-usage.json").write_text(json.dumps(samples))
                shutil.copy(broker.node.log_path, keep / f"{stem}-server.log")
    lines = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    return summarize(sc, variant, kafka, lines, samples, start_wall, load_before)


def prefill(broker: KafkaCluster, mib: float) -> None:
    errors = broker.produce("load", int(mib * MiB / 16384), 16384, settings={"linger.ms": 20})
    if errors:
        raise RuntimeError(f"prefill: {errors[0]}")


def wait_started(events: Path, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while '"daemon_started"' not in events.read_text():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the daemon did not start: {events.read_text()[-2000:]}")
        time.sleep(0.1)


def sample(
    broker: KafkaCluster, sc: Scenario, mount: Path
) -> tuple[list[tuple[float, float]], float]:
    start = time.monotonic()
    start_wall = time.time()
    writer = Writer(broker.bootstrap, "load", sc, start)
    writer.start()
    samples: list[tuple[float, float]] = []
    try:
        while time.monotonic() - start < sc.seconds:
            samples.append((round(time.monotonic() - start, 2), round(df_percent(mount), 3)))
            if not broker.alive():
                break  # a full disk killed it: the samples so far are the figure
            time.sleep(0.1)
    finally:
        writer.stop_event.set()
        writer.join(30)
    return samples, start_wall


def _stamp(event: dict[str, Any]) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def summarize(
    sc: Scenario,
    variant: str,
    kafka: Target,
    lines: list[dict[str, Any]],
    samples: list[tuple[float, float]],
    start_wall: float,
    load_before: str,
) -> Result:
    first = next((e for e in lines if e.get("event") == "delete_records"), None)
    deleted = [e for e in lines if e.get("event") == "segment_deleted"]
    slow = next((e for e in lines if e.get("event") == "broker_reclaim_slow"), None)
    first_s = None if first is None else round(_stamp(first) - start_wall, 1)
    settle = (first_s or 0.0) + 2 * sc.period_s + 5.0
    settled = [p for t, p in samples if t >= settle]
    after_at = sc.stop_s
    if sc.oneoff:  # once the step has landed: from the highest usage on
        after_at = max(samples, key=lambda s: s[1])[0]
    after = [p for t, p in samples if after_at is not None and t >= after_at]
    notes = []
    if samples and samples[-1][0] < sc.seconds - 1:
        notes.append(f"the broker died at {samples[-1][0]} s (full disk?)")
    return Result(
        scenario=sc.name,
        variant=variant,
        release=str(kafka),
        peak_percent=round(max(p for _t, p in samples), 2),
        seconds_over_ceiling=round(sum(0.1 for _t, p in samples if p > sc.ceiling), 1),
        trough_percent=round(min(settled), 2) if settled else None,
        trough_after_percent=round(min(after), 2) if after else None,
        deletions=len(deleted),
        deleted_bytes=sum(int(e.get("bytes") or 0) for e in deleted),
        first_deletion_s=first_s,
        reclaim_slow_s=None if slow is None else round(_stamp(slow) - start_wall, 1),
        overfull_events=sum(1 for e in lines if e.get("event") == "overfull"),
        ceiling=sc.ceiling,
        target=sc.target,
        load_before=load_before,
        load_after=load_average(),
        notes=notes,
    )


def one_off(name: str, at: float, seconds: float) -> Scenario:
    """60 MiB at once at ``at`` s over 100 MiB of older records, a 30 s check: the disk
    stays under its 55 % ceiling and nothing grows after."""
    return Scenario(
        name,
        30000,
        500,
        0.0,
        55.0,
        50.0,
        seconds,
        oneoff=((at, 60.0),),
        prefill_mib=100.0,
        flow=(65.0, 60.0),
    )


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("check15s-4MBps", 15000, 500, 4.0, 70.0, 54.0, 150.0),
        Scenario("check1s-8MBps", 1000, 500, 8.0, 70.0, 67.0, 90.0),
        # Kafka's defaults: the headroom above the ceiling (307 MiB) cannot absorb 0.9 MiB/s
        # over 300 s + 60 s (broker_reclaim_slow), and a forecast needs 660 s of it.
        Scenario("defaults-0.9MBps", None, None, 0.9, 70.0, 60.0, 1320.0, disk_mib=1024),
        # A steady writer that stops: what the last requests cost.
        Scenario("stop-check15s-4MBps", 15000, 500, 4.0, 70.0, 65.0, 160.0, stop_s=100.0),
        # One-off writes, with the daemon running a while and right after its start.
        one_off("oneoff-check30s", 70.0, 160.0),
        one_off("oneoff-at-start-check30s", 1.0, 100.0),
    )
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--release", help="Kafka release, e.g. 4.4.0 (default: DISKGUARD_KAFKA_* or newest 4.x)"
    )
    ap.add_argument("--mode", choices=("kraft", "zk"))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--variants", default="predictive,reactive")
    ap.add_argument("--baseline", metavar="REV", help="also run the daemon code of REV")
    ap.add_argument("--at", metavar="REV", help="run predictive/reactive from REV's code")
    ap.add_argument("--out", default=str(RESULTS / "broker_reclaim.json"))
    ap.add_argument("--keep", help="copy each run's events, usage samples and server.log here")
    args = ap.parse_args(argv)
    kafka = target(args.release, args.mode)
    variants = [v for v in args.variants.split(",") if v]
    if args.at:
        variants = [v if "@" in v else f"{v}@{args.at}" for v in variants]
    variants += [f"baseline:{args.baseline}"] if args.baseline else []
    unknown = [s for s in args.scenarios.split(",") if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario {unknown[0]!r} (known: {', '.join(SCENARIOS)})")
    print(f"# {kafka}, load {load_average()}", flush=True)
    results = []
    for name in args.scenarios.split(","):
        for variant in variants:
            keep = Path(args.keep) if args.keep else None
            res = run_one(kafka, SCENARIOS[name], variant, keep)
            print(json.dumps(asdict(res)), flush=True)
            results.append(asdict(res))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine_info(), "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
