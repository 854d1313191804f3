"""timeindex.last_entry on real files: trimmed, sparse preallocated, truncated, garbage."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.kafkalog import indexfile, timeindex
from diskguard.kafkalog.timeindex import IndexCorrupt, TimeIndexEntry

TEN_MIB = 10 * 1024 * 1024


def _write(path: Path, entries: list[tuple[int, int]], preallocate: int = 0) -> None:
    path.write_bytes(b"".join(struct.pack(">qi", ts, rel) for ts, rel in entries))
    if preallocate:
        os.truncate(path, preallocate - preallocate % 12)


def test_empty_file_has_no_entry(tmp_path: Path) -> None:
    path = tmp_path / "0.timeindex"
    path.write_bytes(b"")
    assert timeindex.last_entry(path) is None


def test_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        timeindex.last_entry(tmp_path / "nope.timeindex")


def test_trimmed_index_gives_last_entry(tmp_path: Path) -> None:
    path = tmp_path / "0.timeindex"
    _write(path, [(1000, 3), (2000, 9), (2500, 17)])
    assert timeindex.last_entry(path) == TimeIndexEntry(2500, 17)
    assert timeindex.last_entry(str(path)) == TimeIndexEntry(2500, 17)


def test_single_entry(tmp_path: Path) -> None:
    path = tmp_path / "0.timeindex"
    _write(path, [(1_700_000_000_000, 0)])
    assert timeindex.last_entry(path) == TimeIndexEntry(1_700_000_000_000, 0)


@pytest.mark.parametrize("count", [0, 1, 2, 341, 342, 1000, 5000])
def test_sparse_preallocated_10mib_reads_a_handful_of_slots(
    tmp_path: Path, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "0.timeindex"
    entries = [(1_700_000_000_000 + i * 10, i * 3) for i in range(count)]
    _write(path, entries, preallocate=TEN_MIB)
    st_ = os.stat(path)
    assert st_.st_size == TEN_MIB - TEN_MIB % 12
    # Really sparse: only the written prefix has blocks.
    assert st_.st_blocks * 512 <= count * 12 + 64 * 1024
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, off: int) -> bytes:
        reads.append(n)
        return real_pread(fd, n, off)

    monkeypatch.setattr(indexfile.os, "pread", counting_pread)
    expected = TimeIndexEntry(*entries[-1]) if entries else None
    assert timeindex.last_entry(path) == expected
    assert len(reads) <= 40 and sum(reads) <= 40 * 12


def test_zero_tail_that_is_written_not_sparse(tmp_path: Path) -> None:
    """A filesystem without hole support (or a copied file) has real zero blocks."""
    path = tmp_path / "0.timeindex"
    entries = [(5000 + i, i) for i in range(100)]
    _write(path, entries)
    with open(path, "ab") as handle:
        handle.write(bytes(12 * 50_000))
    assert timeindex.last_entry(path) == TimeIndexEntry(5099, 99)


def test_all_zero_preallocated_file_has_no_entry(tmp_path: Path) -> None:
    path = tmp_path / "0.timeindex"
    path.touch()
    os.truncate(path, TEN_MIB - TEN_MIB % 12)
    assert timeindex.last_entry(path) is None


@pytest.mark.parametrize("extra", [1, 5, 11])
def test_partial_trailing_entry_is_ignored(tmp_path: Path, extra: int) -> None:
    path = tmp_path / "0.timeindex"
    _write(path, [(10, 0), (20, 4)])
    with open(path, "ab") as handle:
        handle.write(b"\x7f" * extra)
    assert timeindex.last_entry(path) == TimeIndexEntry(20, 4)


def test_partial_only_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "0.timeindex"
    path.write_bytes(b"\x01" * 11)
    assert timeindex.last_entry(path) is None


def test_decreasing_timestamp_is_corrupt_and_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000042.timeindex"
    _write(path, [(5000, 1), (6000, 2), (100, 3)])
    with pytest.raises(IndexCorrupt) as info:
        timeindex.last_entry(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_negative_relative_offset_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "0.timeindex"
    _write(path, [(5000, -7)])
    with pytest.raises(IndexCorrupt):
        timeindex.last_entry(path)


def test_entries_reads_the_used_prefix(tmp_path: Path) -> None:
    path = tmp_path / "0.timeindex"
    written = [(100 + i, i) for i in range(50)]
    _write(path, written, preallocate=TEN_MIB)
    assert timeindex.entries(path) == [TimeIndexEntry(*e) for e in written]


@st.composite
def _index_entries(draw: st.DrawFn) -> list[tuple[int, int]]:
    count = draw(st.integers(min_value=0, max_value=400))
    start = draw(st.integers(min_value=1, max_value=2**62))
    ts_steps = draw(st.lists(st.integers(0, 10**6), min_size=count, max_size=count))
    rel_steps = draw(st.lists(st.integers(1, 1000), min_size=count, max_size=count))
    entries, ts, rel = [], start, 0
    for dt, dr in zip(ts_steps, rel_steps, strict=True):
        ts, rel = min(ts + dt, 2**63 - 1), rel + dr
        entries.append((ts, rel))
    return entries


@settings(max_examples=150, deadline=None)
@given(entries=_index_entries(), tail=st.sampled_from([0, 12, 4096, TEN_MIB]))
def test_roundtrip_random_entries(entries: list[tuple[int, int]], tail: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "0.timeindex"
        _write(path, entries, preallocate=len(entries) * 12 + tail if tail else 0)
        expected = TimeIndexEntry(*entries[-1]) if entries else None
        assert timeindex.last_entry(path) == expected


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=600))
def test_garbage_gives_an_entry_or_index_corrupt(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "0.timeindex"
        path.write_bytes(data)
        try:
            result = timeindex.last_entry(path)
        except IndexCorrupt as exc:
            assert str(path) in str(exc)
        else:
            assert result is None or isinstance(result, TimeIndexEntry)


@pytest.mark.parametrize("claimed_hole", [0, 1, 12, 4096])
def test_a_wrong_seek_hole_answer_does_not_lose_entries(
    tmp_path: Path, claimed_hole: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If a filesystem reports a hole too early, the result is still the true last entry."""
    path = tmp_path / "0.timeindex"
    entries = [(1000 + i, i) for i in range(2000)]
    _write(path, entries, preallocate=TEN_MIB)
    real_lseek = os.lseek

    def lying_lseek(fd: int, pos: int, how: int) -> int:
        if how == os.SEEK_HOLE:
            return claimed_hole
        return real_lseek(fd, pos, how)

    monkeypatch.setattr(indexfile.os, "lseek", lying_lseek)
    assert timeindex.last_entry(path) == TimeIndexEntry(2999, 1999)


# -- clean_last: the shortcut for a trimmed index, never a different answer ------------------


def _clean_and_tail(path: Path) -> tuple[tuple[int, int] | None, timeindex.TimeIndexTail | None]:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        clean = timeindex.clean_last(fd, size)
        try:
            tail: timeindex.TimeIndexTail | None = timeindex.tail_of(fd, size, path)
        except IndexCorrupt:
            tail = None
    finally:
        os.close(fd)
    return clean, tail


@pytest.mark.parametrize(
    ("entries", "preallocate", "extra", "clean"),
    [
        ([(1000, 0), (2000, 5), (3000, 9)], 0, b"", (3000, 9)),
        ([(1000, 0)], 0, b"", (1000, 0)),
        ([(1000, 0), (2000, 5)], 4096, b"", None),  # preallocated: zeros after the entries
        ([(1000, 0), (2000, 5)], 0, b"\x01\x02", None),  # not whole entries
        ([(3000, 0), (2000, 5)], 0, b"", None),  # timestamps go back: corrupt
        ([(1000, 7), (2000, 5)], 0, b"", None),  # offsets go back: corrupt
        ([(-1, 0)], 0, b"", None),  # no timestamp
        ([], 0, b"", None),
        ([(1000 + i, i) for i in range(400)], 0, b"", None),  # over 4 KiB: probed, not read
    ],
)
def test_clean_last_answers_only_for_a_trimmed_sound_index(
    tmp_path: Path,
    entries: list[tuple[int, int]],
    preallocate: int,
    extra: bytes,
    clean: tuple[int, int] | None,
) -> None:
    path = tmp_path / "0.timeindex"
    _write(path, entries, preallocate)
    with open(path, "ab") as f:
        f.write(extra)
    got, tail = _clean_and_tail(path)
    assert got == clean
    if got is not None:  # what the full read says, to the entry
        assert tail is not None and tail.trimmed and tail.entry is not None
        assert got == (tail.entry.timestamp_ms, tail.entry.relative_offset)
