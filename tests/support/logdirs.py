"""A standard Kafka log dir whose global-oldest deletion order is known in advance.

``build(mount)`` writes three topics x 2 partitions x 5 segments (~256 KiB each) with
interleaved timestamps under ``mount/kafka-logs``; ``expected_order(truth)`` is the order
KIP-61 must delete its closed segments in (internal ``__`` topics never).
"""

from __future__ import annotations

from pathlib import Path

from support.kafkagen import SegmentSpec, write_log_dir

BASE_TS = 1_700_000_000_000

# (topic, partition, base offset) -> (max timestamp ms, the segment's files)
Truth = dict[tuple[str, int, int], tuple[int, list[Path]]]


def build(mount: Path) -> tuple[Path, Truth]:
    """Three topics x 2 partitions x 5 segments (~256 KiB each), interleaved timestamps."""
    log_dir = mount / "kafka-logs"
    parts = {}
    for t_index, topic in enumerate(["orders", "clicks", "__consumer_offsets"]):
        for p in range(2):
            specs = [
                SegmentSpec(
                    records=25,
                    payload_size=10_000,
                    first_timestamp_ms=BASE_TS + (s * 6 + t_index * 2 + p) * 60_000,
                    timestamp_step_ms=10,
                    records_per_batch=5,
                )
                for s in range(5)
            ]
            parts[(topic, p)] = specs
    layout = write_log_dir(log_dir, parts)
    truth = {}
    for (topic, p), part in layout.partitions.items():
        for seg in part.closed:
            truth[(topic, p, seg.base_offset)] = (seg.max_timestamp_ms, list(seg.files))
    return log_dir, truth


def expected_order(truth: Truth) -> list[tuple[str, int, int]]:
    """Closed segments of non-internal topics, oldest first (ties by topic, partition, offset)."""
    keys = [k for k in truth if not k[0].startswith("__")]
    return sorted(keys, key=lambda k: (truth[k][0], k[0], k[1], k[2]))
