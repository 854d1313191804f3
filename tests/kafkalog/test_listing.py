"""The name-only partition listing (``list_partition(full=False)``), against the full one.

The plan's listing keeps regular files only and finds segments with one regex over their
names: it must give exactly what the full, stat-every-file listing gives, whatever else
the dir holds (a dir, symlink or FIFO named like a segment, odd names, ``*.deleted``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.kafkalog.dating import AgeCache, SegmentFileReader
from diskguard.kafkalog.listing import REMOTE_LOG_SNAPSHOT, PartitionListing, list_partition
from diskguard.kafkalog.scan import scan_log_dir
from support.kafkagen import SegmentSpec, write_log_dir, write_partition


def _make(kind: str, path: Path, target: Path) -> None:
    if kind == "dir":
        path.mkdir()
        (path / "inside").write_bytes(b"x")
    elif kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        raise AssertionError(kind)


def _same(fast: PartitionListing, full: PartitionListing) -> None:
    assert fast.bases == full.bases
    assert fast.deleted_bytes == full.deleted_bytes
    assert fast.deleted_files == full.deleted_files
    assert fast.remote_log_state == full.remote_log_state
    assert fast.txn_indexes == full.txn_indexes
    assert {(x.name, x.ino) for x in fast.linked} == {
        (x.name, x.ino) for x in full.linked if x.deleted
    }


@pytest.mark.parametrize("kind", ["dir", "symlink", "fifo"])
@pytest.mark.parametrize("base", [99990, 5], ids=["newest", "middle"])
def test_a_non_regular_entry_named_like_a_segment_is_never_one(
    tmp_path: Path, kind: str, base: int
) -> None:
    """Named like a newer segment it would make the real active segment deletable; named
    like one between two real segments it would cut the older one's ``next_offset`` short."""
    layout = write_partition(tmp_path / "logs", "orders", 0, [SegmentSpec(records=10)] * 3)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    _make(kind, layout.path / f"{base:020d}.log", outside)
    fast = list_partition(str(layout.path), full=False)
    assert fast.bases == layout.base_offsets == (0, 10, 20)
    _same(fast, list_partition(str(layout.path), full=True))
    part = scan_log_dir(str(tmp_path / "logs"), "/", []).partitions[0]
    assert part.active_base_offset == 20
    assert part.candidates == ((0, 10), (10, 20))


def test_remote_log_snapshot_of_any_kind_and_txn_indexes_are_seen(tmp_path: Path) -> None:
    layout = write_partition(tmp_path / "logs", "orders", 0, [SegmentSpec(records=10)] * 3)
    path = str(layout.path)
    plain = list_partition(path, full=False)
    assert not plain.remote_log_state and not plain.txn_indexes
    (layout.path / REMOTE_LOG_SNAPSHOT).mkdir()
    (layout.path / f"{10:020d}.txnindex").write_bytes(bytes(34))
    fast = list_partition(path, full=False)
    assert fast.remote_log_state and fast.txn_indexes
    _same(fast, list_partition(path, full=True))


def test_deleted_files_are_counted_by_the_name_only_listing(tmp_path: Path) -> None:
    layout = write_partition(tmp_path / "logs", "orders", 0, [SegmentSpec(records=10)] * 3)
    (layout.path / f"{0:020d}.log.deleted").write_bytes(b"y" * 5000)
    (layout.path / f"{0:020d}.index.deleted").write_bytes(b"z" * 100)
    os.link(layout.path / f"{0:020d}.index.deleted", tmp_path / "backup")
    os.mkfifo(layout.path / f"{0:020d}.timeindex.deleted")  # not a regular file: not counted
    fast = list_partition(str(layout.path), full=False)
    assert fast.deleted_files == 2 and fast.deleted_bytes > 0
    assert [x.name for x in fast.linked] == [f"{0:020d}.index.deleted"]
    _same(fast, list_partition(str(layout.path), full=True))


_NAMES = st.sampled_from(
    [
        *(f"{b:020d}.log" for b in (0, 7, 10, 99, 10**19)),
        *(f"{b:020d}{sfx}" for b in (0, 7) for sfx in (".index", ".timeindex", ".txnindex")),
        "0000000000000000000.log",  # 19 digits
        "000000000000000000000.log",  # 21 digits
        "0000000000000000000a.log",
        "00000000000000000000.LOG",
        "00000000000000000003.log.deleted",
        "00000000000000000003.log.swap",
        "00000000000000000004.log\n",
        "x_log",
        "٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠.log",  # non-ASCII digits
        ".log",
        "leader-epoch-checkpoint",
        REMOTE_LOG_SNAPSHOT,
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    entries=st.dictionaries(_NAMES, st.sampled_from(["file", "dir", "symlink", "fifo"])),
)
def test_the_name_only_listing_agrees_with_the_full_one(entries: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp) / "orders-0"
        part.mkdir()
        for name, kind in entries.items():
            if kind == "file":
                (part / name).write_bytes(b"data")
            else:
                _make(kind, part / name, Path(tmp) / "nowhere")
        fast = list_partition(str(part), full=False)
        _same(fast, list_partition(str(part), full=True))
        regular_logs = sorted(
            int(n[:20])
            for n, kind in entries.items()
            if kind == "file" and len(n) == 24 and n.endswith(".log") and n[:20].isascii()
            if n[:20].isdigit()
        )
        assert list(fast.bases) == regular_logs


def test_dating_looks_for_a_txnindex_only_where_the_listing_saw_one(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    layout = write_log_dir(log_dir, {("orders", p): [SegmentSpec(records=5)] * 3 for p in (0, 1)})
    txn = layout.partitions[("orders", 1)].segments[0].log_path.with_suffix(".txnindex")
    txn.write_bytes(bytes(34))
    parts = {p.partition: p for p in scan_log_dir(str(log_dir), "/", []).partitions}
    assert not parts[0].txn_indexes and parts[1].txn_indexes
    reader = SegmentFileReader(AgeCache())
    plain, with_txn = reader(parts[0], 0), reader(parts[1], 0)
    assert [Path(f).suffix for f in plain.files] == [".log", ".index", ".timeindex"]
    assert [Path(f).suffix for f in with_txn.files] == [".log", ".index", ".timeindex", ".txnindex"]
    assert with_txn.bytes == plain.bytes + os.lstat(txn).st_blocks * 512
