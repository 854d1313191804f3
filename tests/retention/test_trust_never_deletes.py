"""A listing taken on inotify's word (``ListingCache.trust``, the idle daemon's snapshot) is
for the snapshot only: a cycle that finds something to delete plans it from listings read
now. The hints name the dirs touched before the cycle began; a dir changed after that (a
topic deleted and made again, a roll) is still taken as it was, and DeleteRecords up to a
stale segment's next offset would delete records of segments that are not those listed."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from diskguard.broker.client import BrokerClient
from diskguard.config import load_config
from diskguard.retention.cycle import RetentionCycle
from support import kafkagen
from support.configs import write_config
from support.fakes import AcceptingAdmin
from support.kafkagen import hold_lock


def test_a_cycle_that_deletes_reads_its_listings_now(tmp_path: Path) -> None:
    log_dir = tmp_path / "kafka"
    part = log_dir / "orders-0"
    kafkagen.write_partition(log_dir, "orders", 0, [kafkagen.SegmentSpec()] * 4)
    past = time.time() - 30  # kept listings: no dir changed within the cache's settle time
    for path in (log_dir, part):
        os.utime(path, (past, past))
    config = load_config(
        write_config(
            tmp_path,
            log_dir,
            broker={"bootstrap_servers": "127.0.0.1:1"},
            disk_usage_percent=0.1,  # over: the cycle deletes
            mode="broker",
        )
    )
    admin = AcceptingAdmin()
    with hold_lock(log_dir):
        runtime = RetentionCycle(
            config, broker=BrokerClient("127.0.0.1:1", {}, timeout=2.0, admin=admin)
        )
        cache = runtime.inputs.cache
        # What the last full scan kept: four segments, offsets 0-39.
        cache.log_dir_entries(str(log_dir))
        assert cache.listing(str(part), True).bases == (0, 10, 20, 30)
        cache.prune()
        # After the hints were taken: the topic deleted and made again, two segments.
        shutil.rmtree(part)
        kafkagen.write_partition(log_dir, "orders", 0, [kafkagen.SegmentSpec()] * 2)
        cache.trust(frozenset())
        outcome = runtime.enforce(full=True)
        runtime.close()
    assert [(d.base_offset, d.next_offset) for d in outcome.plan.deletions] == [(0, 10)]
    # Records 10-19 are the new topic's active segment: never asked to go.
    assert admin.calls == [[("orders", 0, 10)]]
