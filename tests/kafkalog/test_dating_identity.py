"""Dating a head reads its ``.timeindex`` through one descriptor: the same files, bytes and
age-cache identity as ``lstat``'ing each file, and the same refusals of what is not a
regular file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.kafkalog import indexfile
from diskguard.kafkalog.dating import AgeCache, SegmentFileReader
from diskguard.kafkalog.model import Partition
from diskguard.kafkalog.scan import scan_log_dir
from support.kafkagen import SegmentSpec, write_log_dir


def _partition(tmp_path: Path) -> tuple[Partition, Path]:
    log_dir = tmp_path / "logs"
    layout = write_log_dir(log_dir, {("orders", 0): [SegmentSpec(records=5)] * 3})
    part = scan_log_dir(str(log_dir), "/", []).partitions[0]
    return part, layout.partitions[("orders", 0)].segments[0].log_path


def test_files_bytes_and_identity_are_those_lstat_gives(tmp_path: Path) -> None:
    part, log_path = _partition(tmp_path)
    ages = AgeCache()
    info = SegmentFileReader(ages)(part, 0)
    paths = [str(log_path.with_suffix(s)) for s in (".log", ".index", ".timeindex")]
    stats = [os.lstat(p) for p in paths]
    assert list(info.files) == paths
    assert info.bytes == sum(s.st_blocks * 512 for s in stats)
    assert info.timestamp_source == "timeindex"
    key = tuple((p, s.st_ino, s.st_size, s.st_mtime_ns) for p, s in zip(paths, stats, strict=True))
    assert ages.get(key) == (info.max_timestamp_ms, "timeindex", ())
    # Cached: the next reader takes the age from the cache, and says the same.
    again = SegmentFileReader(ages)
    assert again(part, 0) == info and again.warnings == []


def test_an_age_from_the_cache_brings_the_warnings_its_dating_gave(tmp_path: Path) -> None:
    """What a plan warns of does not depend on which heads an earlier walk dated (a
    broker-mode plan walks twice; its worker dated ahead in the first walk)."""
    part, log_path = _partition(tmp_path)
    with open(log_path.with_suffix(".timeindex"), "ab") as f:
        f.write(b"\x01\x02\x03")  # not a whole number of entries: the .log dates it
    ages = AgeCache()
    first = SegmentFileReader(ages)
    info = first(part, 0)
    assert info.timestamp_source == "log" and len(first.warnings) == 1
    again = SegmentFileReader(ages)
    assert again(part, 0) == info and again.warnings == first.warnings


@pytest.mark.parametrize("kind", ["missing", "symlink", "fifo", "dir"])
def test_a_timeindex_that_is_not_a_regular_file_is_skipped_and_the_log_dates_it(
    tmp_path: Path, kind: str
) -> None:
    part, log_path = _partition(tmp_path)
    expected = SegmentFileReader()(part, 0).max_timestamp_ms
    ti = log_path.with_suffix(".timeindex")
    ti.unlink()
    if kind == "symlink":
        ti.symlink_to(log_path.with_suffix(".index"))
    elif kind == "fifo":
        os.mkfifo(ti)
    elif kind == "dir":
        ti.mkdir()
    reader = SegmentFileReader(AgeCache())
    info = reader(part, 0)
    assert str(ti) not in info.files
    assert [Path(f).suffix for f in info.files] == [".log", ".index"]
    assert (info.max_timestamp_ms, info.timestamp_source) == (expected, "log")
    assert reader.warnings == []


def test_an_unreadable_timeindex_is_still_counted_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cannot be opened for another reason (EACCES, EMFILE...): it is still one of the
    segment's files (lstat), and reading it the usual way names the problem."""
    part, log_path = _partition(tmp_path)
    ti = str(log_path.with_suffix(".timeindex"))
    real_open = os.open

    def refusing(path: str, flags: int, *args: int) -> int:
        if os.fspath(path) == ti:
            raise PermissionError(13, "Permission denied", ti)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    reader = SegmentFileReader(AgeCache())
    info = reader(part, 0)
    assert ti in info.files
    assert info.timestamp_source == "log"
    assert any("Permission denied" in w for w in reader.warnings), reader.warnings


@settings(max_examples=200, deadline=None)
@given(
    slots=st.lists(st.sampled_from([bytes(12), b"\x00" * 11 + b"\x01", b"\x7f" * 12]), max_size=40),
    tail=st.integers(0, 11),
    first_may_be_zero=st.booleans(),
)
def test_searching_the_read_bytes_finds_what_probing_the_file_finds(
    slots: list[bytes], tail: int, first_may_be_zero: bool
) -> None:
    """Gaps included (a corrupt index): the in-memory search is the same search."""
    data = b"".join(slots) + b"\x01" * tail
    with tempfile.NamedTemporaryFile() as fh:
        fh.write(data)
        fh.flush()
        fd = os.open(fh.name, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            probed = indexfile.used_slots(fd, 12, first_may_be_zero=first_may_be_zero)
            read = indexfile.used_slots(
                fd, 12, first_may_be_zero=first_may_be_zero, size=size, data=os.pread(fd, size, 0)
            )
        finally:
            os.close(fd)
    assert read == probed
