"""An offline rescue that meets a segment file it cannot remove, with a REAL Kafka broker
(``support.kafka.target``).

The oldest segment's ``.index`` is immutable (``chattr +i``: EPERM even for root). Kafka 2.2
itself cannot load a log dir holding such a file (it opens every segment's files read-write:
``FileNotFoundException ... (Operation not permitted)``, the log dir fails, the broker shuts
down; measured), so the flag has to be lifted before the broker starts. Whoever set it meant
to keep that segment: diskguard renames a segment's ``.log`` first, and had it left the
``.log`` gone and the index behind, the broker started after lifting the flag would delete
the orphaned index and the segment's records would be lost. So the ``.log`` is renamed back
and the segment kept whole, the partition set aside, and the space taken from another topic.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from support import fsfixtures
from support.cli import json_events, run_cli
from support.configs import write_config
from support.disks import ceiling_under
from support.kafka import Target
from support.kafka.cluster import running_broker

pytestmark = pytest.mark.realkafka

KEPT, OTHER = "imm-kept", "imm-other"


def bases(pdir: Path) -> list[int]:
    return sorted(int(p.name[:-4]) for p in pdir.glob("*.log"))


def test_the_broker_starts_after_a_rescue_that_met_an_immutable_index(
    kafka_target: Target, tmp_path: Path
) -> None:
    with (
        fsfixtures.loop_ext4(64 * fsfixtures.MiB, 0, name="immutable-disk") as mount,
        running_broker(
            kafka_target.release,
            kafka_target.classpath,
            mount / "kafka-logs",
            mode=kafka_target.mode,
        ) as broker,
    ):
        for topic in (KEPT, OTHER):  # KEPT first: its segments are the globally oldest
            broker.create_topic(topic, **broker.segment_config(200_000))
            assert broker.produce(topic, 1200, 500, settings={"batch.size": 50_000}) == []
        kept_dir, other_dir = broker.log_dir / f"{KEPT}-0", broker.log_dir / f"{OTHER}-0"
        kept_bases, other_bases = bases(kept_dir), bases(other_dir)
        assert len(kept_bases) >= 3 and len(other_bases) >= 3
        broker.stop()  # a clean stop: .lock is free, diskguard's auto mode goes offline
        victim = kept_dir / f"{kept_bases[0]:020d}.index"
        subprocess.run(["chattr", "+i", str(victim)], check=True)
        try:
            before = sorted(p.name for p in kept_dir.iterdir())
            config = write_config(
                tmp_path,
                broker.log_dir,
                broker={"bootstrap_servers": broker.bootstrap},
                assume_delete_policy=[f"^({KEPT}|{OTHER})$"],
                protect_topics=[f"^(?!({KEPT}|{OTHER})$)"],
                disk_usage_percent=round(ceiling_under(broker.log_dir, 150_000), 6),
            )
            proc = run_cli("enforce", "--once", "--json", "-c", str(config), timeout=120)
            events = json_events(proc.stdout)
            assert proc.returncode == 1, (proc.stderr, events)
            assert {e["mode"] for e in events if e["event"] == "retention_cycle"} == {"offline"}
            failed = [e for e in events if e["event"] == "segment_delete_failed"]
            assert [(e["topic"], e["base_offset"]) for e in failed] == [(KEPT, kept_bases[0])]
            assert f"Operation not permitted ({victim})" in failed[0]["error"]
            deleted = [
                (e["topic"], e["base_offset"]) for e in events if e["event"] == "segment_deleted"
            ]
            assert deleted == [(OTHER, other_bases[0])], events
            assert sorted(p.name for p in kept_dir.iterdir()) == before  # whole, as it was
            assert "over its" not in proc.stderr, proc.stderr

            # Kafka cannot open an immutable segment file read-write: lift the flag, as the
            # operator must before starting the broker, and find the segment whole.
            subprocess.run(["chattr", "-i", str(victim)], check=True)
            broker.start()
            time.sleep(10)
            assert broker.alive(), broker.log_text()[-3000:]
            assert broker.produce(KEPT, 10, 100, settings={"acks": "all"}) == []
            reader = Consumer(
                {"bootstrap.servers": broker.bootstrap, "group.id": "imm-check", "log_level": 0}
            )
            try:
                low, _high = reader.get_watermark_offsets(TopicPartition(KEPT, 0), timeout=10)
                assert low == kept_bases[0]  # nothing of the kept segment went
                low, _high = reader.get_watermark_offsets(TopicPartition(OTHER, 0), timeout=10)
                assert low == other_bases[1]
            finally:
                reader.close()
            errors = [line for line in broker.log_since_start().splitlines() if "] ERROR " in line]
            assert not errors, json.dumps(errors[:5], indent=1)
        finally:
            subprocess.run(["chattr", "-i", str(victim)], check=True)
