"""The topics a one-shot plan asks the broker about before it scans (``topics_on_disk``)
are the topics of the partitions its scan then finds: not a ``-delete``, ``-future`` or
``-stray`` dir's, not a symlink's, not a file's or another dir's."""

from __future__ import annotations

import os
from pathlib import Path

from diskguard.config import load_config
from diskguard.retention.inputs import PlanInputs
from support.configs import write_config
from support.kafkagen import SegmentSpec, write_partition


def test_the_topics_on_disk_are_the_scans(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    for topic, partition in (("orders", 0), ("orders", 1), ("clicks", 3), ("a.b_c-d", 0)):
        write_partition(root, topic, partition, [SegmentSpec(records=2)] * 2)
    (root / "gone-0.1f2e3d4c5b6a79880123456789abcdef-delete").mkdir()
    (root / "moving-1.1f2e3d4c5b6a79880123456789abcdef-future").mkdir()
    (root / "left-2.1f2e3d4c5b6a79880123456789abcdef-stray").mkdir()
    (root / "lost+found").mkdir()
    (root / "notes-7").write_text("a file named like a partition dir\n")
    os.symlink(root / "orders-0", root / "linked-0")
    config = load_config(write_config(tmp_path, root), writes=False)
    inputs = PlanInputs(config)
    before = inputs.topics_on_disk()
    scanned = inputs.scan()
    found = {p.topic for fs in scanned.filesystems for d in fs.log_dirs for p in d.partitions}
    assert before == found == {"orders", "clicks", "a.b_c-d"}
