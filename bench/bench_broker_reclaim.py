"""Does the KIP-61 ceiling hold in broker mode beside a real Kafka broker?

A real Apache Kafka broker (``DISKGUARD_KAFKA_HOME`` or ``--kafka-home``: a distribution
directory; started through ``shared/kafka/kafka-test-broker`` as ``nobody``) writes into a
384 MiB loop ext4 while a producer sends at a fixed rate; ``diskguard run`` guards it in broker
mode (DeleteRecords). Usage is sampled as df computes it every 100 ms. Per scenario, two runs
in the same session:

- ``predictive``: diskguard as shipped (growth rate x the broker's reclaim latency);
- ``reactive`` (baseline): the same daemon with the forecast switched off, i.e. asking only
  once the disk is over its ceiling — what the first release did.

Reported: peak usage, seconds over the ceiling, the lowest usage once the loop has settled
(after the first deletion plus two check periods), and deletions. Targets (issue 12):
15 s check at 4 MB/s -> peak <= ceiling + 1 point, trough >= target - 3 points; 1 s check at
8 MB/s -> at most 1 s over the ceiling. Writes ``bench/results/broker_reclaim.json``.
Not part of the test suite; needs root (loop mount) and Java.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import pwd
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "demo"))

from support import fsfixtures  # noqa: E402
from support.disks import df_percent  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def _broker_script() -> Path:
    """``shared/kafka/kafka-test-broker`` beside the checkout (or above a worktree)."""
    for parent in ROOT.parents:
        candidate = parent / "shared" / "kafka" / "kafka-test-broker"
        if candidate.exists():
            return candidate
    return Path(os.environ.get("KAFKA_TEST_BROKER", "kafka-test-broker"))


BROKER_SCRIPT = _broker_script()
MiB = 1024 * 1024
#: The baseline: the daemon as it was, with no growth forecast (asks once over the ceiling).
REACTIVE = (
    "import diskguard.retention.forecaster as r; "
    "r.Forecaster.growth_rate = lambda self, mount: None; "
    "from diskguard.cli import main; main()"
)


@dataclass(frozen=True)
class Scenario:
    name: str
    check_ms: int
    rate_mib: float
    ceiling: float
    target: float
    seconds: float


@dataclass
class Result:
    scenario: str
    variant: str
    peak_percent: float
    seconds_over_ceiling: float
    trough_percent: float | None
    deletions: int
    first_deletion_s: float | None
    ceiling: float
    target: float


@contextlib.contextmanager
def broker(kafka_home: Path, work: Path, log_dir: Path, port: int, check_ms: int) -> Iterator[str]:
    env = {**os.environ, "KAFKA_DIST": str(kafka_home)}
    cmd = [
        str(BROKER_SCRIPT),
        "start",
        str(work),
        "--port",
        str(port),
        "--zk-port",
        str(port + 1000),
        "--log-dirs",
        str(log_dir),
        "--user",
        "nobody",
        f"log.retention.check.interval.ms={check_ms}",
        "log.segment.delete.delay.ms=500",
        "num.partitions=4",
        "log.segment.bytes=1048576",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"broker did not start: {out.stdout}{out.stderr}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run(
            [str(BROKER_SCRIPT), "stop", str(work)], env=env, capture_output=True, timeout=120
        )


def produce(bootstrap: str, topic: str, rate: float, stop: threading.Event) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "batch.size": 262144,
            "compression.type": "none",
            "log_level": 0,
        }
    )
    payload = os.urandom(16384)
    start = time.monotonic()
    sent = 0
    while not stop.is_set():
        due = (time.monotonic() - start) * rate
        while sent < due:
            try:
                producer.produce(topic, payload)
                sent += len(payload)
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(10)


def run_one(
    kafka_home: Path, sc: Scenario, variant: str, port: int, keep: Path | None = None
) -> Result:
    with (
        fsfixtures.loop_ext4(384 * MiB, 0) as mount,
        tempfile.TemporaryDirectory(prefix="dg-bench-") as tmp,
    ):
        # The broker runs as nobody: it must reach its log dir and write its logs.
        os.chmod(tmp, 0o755)
        os.chmod(mount.parent, 0o755)
        nobody = pwd.getpwnam("nobody")
        log_dir = mount / "kafka"
        log_dir.mkdir()
        os.chown(log_dir, nobody.pw_uid, nobody.pw_gid)
        work = Path(tmp) / "broker"
        with broker(kafka_home, work, log_dir, port, sc.check_ms) as bootstrap:
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
            futures = admin.create_topics(
                [NewTopic("load", 4, 1, config={"segment.bytes": str(MiB)})]
            )
            for f in futures.values():
                f.result(30)
            cfg = Path(tmp) / "diskguard.toml"
            state = Path(tmp) / "state"
            cfg.write_text(
                f'[broker]\nlog_dirs = ["{log_dir}"]\nbootstrap_servers = "{bootstrap}"\n'
                f"[retention]\ndisk_usage_percent = {sc.ceiling}\ntarget_percent = {sc.target}\n"
                'mode = "broker"\ncheck_interval = "5s"\n'
                f'[daemon]\nstate_dir = "{state}"\n[logging]\nlevel = "info"\n'
            )
            argv = (
                [sys.executable, "-m", "diskguard"]
                if variant == "predictive"
                else [sys.executable, "-c", REACTIVE]
            )
            events = Path(tmp) / "events.jsonl"
            with open(events, "w") as out:
                daemon = subprocess.Popen([*argv, "run", "-c", str(cfg)], stdout=out, stderr=out)
            stop = threading.Event()
            writer = threading.Thread(
                target=produce, args=(bootstrap, "load", sc.rate_mib * MiB, stop), daemon=True
            )
            samples: list[tuple[float, float]] = []
            start = time.monotonic()
            wall_start = time.time()
            writer.start()
            try:
                while time.monotonic() - start < sc.seconds:
                    samples.append((time.monotonic() - start, df_percent(mount)))
                    time.sleep(0.1)
            finally:
                stop.set()
                writer.join(30)
                daemon.terminate()
                daemon.wait(30)
            lines = [json.loads(x) for x in events.read_text().splitlines() if x.startswith("{")]
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                stem = f"{sc.name}-{variant}"
                (keep / f"{stem}-events.jsonl").write_text(events.read_text())
                (keep / f"{stem}-usage.json").write_text(json.dumps(samples))
    first = next((e for e in lines if e.get("event") == "delete_records"), None)
    deletions = sum(1 for e in lines if e.get("event") == "segment_deleted")
    first_s: float | None = None
    if first is not None:
        stamp = dt.datetime.fromisoformat(str(first["timestamp"]).replace("Z", "+00:00"))
        first_s = round(stamp.timestamp() - wall_start, 1)
    settle = (first_s or 0.0) + 2 * sc.check_ms / 1000.0 + 5.0
    over = sum(0.1 for _t, p in samples if p > sc.ceiling)
    settled = [p for t, p in samples if t >= settle]
    return Result(
        scenario=sc.name,
        variant=variant,
        peak_percent=round(max(p for _t, p in samples), 2),
        seconds_over_ceiling=round(over, 1),
        trough_percent=round(min(settled), 2) if settled else None,
        deletions=deletions,
        first_deletion_s=first_s,
        ceiling=sc.ceiling,
        target=sc.target,
    )


SCENARIOS = {
    "check15s-4MBps": Scenario("check15s-4MBps", 15000, 4.0, 70.0, 54.0, 150.0),
    "check1s-8MBps": Scenario("check1s-8MBps", 1000, 8.0, 70.0, 67.0, 90.0),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kafka-home", default=os.environ.get("DISKGUARD_KAFKA_HOME"))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--variants", default="predictive,reactive")
    ap.add_argument("--out", default=str(RESULTS / "broker_reclaim.json"))
    ap.add_argument("--keep", help="copy each run's daemon events and usage samples here")
    args = ap.parse_args(argv)
    if not args.kafka_home:
        print("bench_broker_reclaim: set DISKGUARD_KAFKA_HOME to a Kafka distribution dir")
        return 2
    results = []
    port = 39092
    for name in args.scenarios.split(","):
        for variant in args.variants.split(","):
            keep = Path(args.keep) if args.keep else None
            res = run_one(Path(args.kafka_home), SCENARIOS[name], variant, port, keep)
            port += 2
            print(json.dumps(asdict(res)), flush=True)
            results.append(asdict(res))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
