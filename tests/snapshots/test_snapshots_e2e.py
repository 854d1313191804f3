"""Snapshots end to end: ``diskguard run`` → spool → real Kafka-protocol broker → Spark.

The broker is absent when the daemon starts (everything waits in the spool), comes up, then
hangs mid-way (SIGSTOP: an outage that keeps its data — tansu's memory storage forgets
everything if the process is killed) and recovers. Afterwards ``diskguard aggregate``
reads the topic back: every spooled snapshot arrives, exactly once after dedup.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq

from support.cli import run_cli
from support.configs import write_config
from support.daemonproc import DaemonProc
from support.kafkagen import SegmentSpec, write_log_dir
from support.net import free_port
from support.spool import spooled
from support.tansu import TansuBroker

TOPIC = "diskguard.snapshots"


def wait_spooled(state: Path, count: int, daemon: DaemonProc) -> None:
    """Until the spool holds ``count`` records: a snapshot every 0.3 s on a quiet machine,
    fewer on a loaded one, so the test waits for them rather than for a time."""
    deadline = time.monotonic() + 60
    while len(spooled(state)) < count:
        assert time.monotonic() < deadline, (len(spooled(state)), count)
        assert daemon.proc.poll() is None, daemon.stderr_tail()
        time.sleep(0.1)


def _cursor(state: Path) -> tuple[int, int]:
    try:
        cur = json.loads((state / "spool" / "shipped.json").read_text())
    except FileNotFoundError:
        return (-1, 0)
    return (int(cur["seq"]), int(cur["offset"]))


def shipped_upto(state: Path) -> tuple[int, int]:
    return _cursor(state)


def spool_end(state: Path) -> tuple[int, int]:
    """(seq, byte offset) of the end of the newest spool file."""
    files = sorted((state / "spool").glob("*.jsonl"))
    last = files[-1]
    return (int(last.stem), last.stat().st_size)


def shipped_count(state: Path) -> int:
    """How many spooled records lie before the shipping cursor."""
    seq, offset = _cursor(state)
    count = 0
    for f in sorted((state / "spool").glob("*.jsonl")):
        data = f.read_bytes()
        if int(f.stem) < seq:
            count += data.count(b"\n")
        elif int(f.stem) == seq:
            count += data[:offset].count(b"\n")
    return count


def test_daemon_snapshots_reach_spark_through_a_broker_outage(tmp_path: Path) -> None:
    log_dir = tmp_path / "kafka-logs"
    write_log_dir(log_dir, {("orders", p): [SegmentSpec(records=20)] * 3 for p in range(3)})
    state = tmp_path / "state"
    broker = TansuBroker(free_port())
    config = write_config(
        tmp_path,
        log_dir,
        broker={
            "bootstrap_servers": broker.bootstrap,
            "client": {"message.timeout.ms": 3000},
        },
        snapshots={"interval": "0.3s", "topic": TOPIC, "host": "e2e-host"},
        state_dir=state,
        assume_delete_policy=None,
        mode="dry-run",
    )
    try:
        with DaemonProc(config) as daemon:
            daemon.wait_for("daemon_started")
            wait_spooled(state, 3, daemon)  # broker absent: snapshots pile up in the spool
            broker.start()
            # tansu creates the topic on the first produce (auto-create).
            daemon.wait_for("snapshot_shipped", timeout=30)
            broker.pause()  # hung broker mid-stream
            time.sleep(4.0)
            broker.resume()
            wait_spooled(state, 10, daemon)
            # Everything spooled up to now must be delivered while the daemon runs on.
            marker = spool_end(state)
            marker_records = len(spooled(state))
            deadline = time.monotonic() + 60
            while shipped_upto(state) < marker:
                assert time.monotonic() < deadline, (shipped_upto(state), marker)
                time.sleep(0.2)
            assert daemon.stop() == 0
        records = spooled(state)
        assert len(records) >= 10
        out = tmp_path / "fleet"
        # A bound for a hang only (as for every aggregate run in the suite): on a loaded
        # machine the first local run of an install also dumps the class archive (up to
        # classarchive.DUMP_TIMEOUT_S) after its job, which alone took minutes there.
        proc = run_cli(
            "aggregate",
            "--input",
            f"kafka://{broker.bootstrap}/{TOPIC}",
            "--output",
            str(out),
            "--master",
            "local[2]",
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        broker.kill()
    summary = json.loads((out / "summary.json").read_text())
    delivered = {(r["host"], r["mount"], r["ts_ms"]) for r in records[: shipped_count(state)]}
    everything = {(r["host"], r["mount"], r["ts_ms"]) for r in records}
    # Every snapshot the spool counts as shipped reached Spark, exactly once after dedup; any
    # later one is either in Kafka too (delivered while stopping) or still in the spool.
    assert len(delivered) >= marker_records > 0
    unique_in_kafka = summary["records"] - summary["duplicates"]
    assert len(delivered) <= unique_in_kafka <= len(everything)
    disks = pq.read_table(out / "disks.parquet").to_pylist()
    assert [d["host"] for d in disks] == ["e2e-host"]
