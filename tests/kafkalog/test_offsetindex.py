"""offsetindex.last_entry on real files, including a legitimate (0, 0) first entry."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.kafkalog import offsetindex
from diskguard.kafkalog.offsetindex import IndexCorrupt, OffsetIndexEntry

TEN_MIB = 10 * 1024 * 1024


def _write(path: Path, entries: list[tuple[int, int]], preallocate: int = 0) -> None:
    path.write_bytes(b"".join(struct.pack(">ii", rel, pos) for rel, pos in entries))
    if preallocate:
        os.truncate(path, preallocate - preallocate % 8)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "0.index"
    path.write_bytes(b"")
    assert offsetindex.last_entry(path) is None


def test_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "0.index"
    _write(path, [(12, 4100), (25, 8300)])
    assert offsetindex.last_entry(path) == OffsetIndexEntry(25, 8300)


@pytest.mark.parametrize("count", [1, 2, 3, 1000])
def test_sparse_preallocated(tmp_path: Path, count: int) -> None:
    path = tmp_path / "0.index"
    entries = [(10 * (i + 1), 4096 * (i + 1)) for i in range(count)]
    _write(path, entries, preallocate=TEN_MIB)
    assert os.stat(path).st_blocks * 512 <= count * 8 + 64 * 1024
    assert offsetindex.last_entry(path) == OffsetIndexEntry(*entries[-1])


def test_zero_first_entry_followed_by_entries_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "0.index"
    _write(path, [(0, 0), (7, 4200), (15, 8400)], preallocate=TEN_MIB)
    assert offsetindex.last_entry(path) == OffsetIndexEntry(15, 8400)
    assert offsetindex.entries(path)[0] == OffsetIndexEntry(0, 0)


def test_zero_first_entry_then_one_more(tmp_path: Path) -> None:
    path = tmp_path / "0.index"
    _write(path, [(0, 0), (7, 4200)], preallocate=TEN_MIB)
    assert offsetindex.last_entry(path) == OffsetIndexEntry(7, 4200)


@pytest.mark.parametrize("size", [8, 16, TEN_MIB])
def test_all_zero_file_has_no_entry(tmp_path: Path, size: int) -> None:
    path = tmp_path / "0.index"
    path.touch()
    os.truncate(path, size)
    assert offsetindex.last_entry(path) is None


def test_partial_trailing_entry_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "0.index"
    _write(path, [(3, 100)])
    with open(path, "ab") as handle:
        handle.write(b"\x01\x02\x03")
    assert offsetindex.last_entry(path) == OffsetIndexEntry(3, 100)


def test_backwards_positions_are_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.index"
    _write(path, [(3, 9000), (9, 100)])
    with pytest.raises(IndexCorrupt) as info:
        offsetindex.last_entry(path)
    assert str(path) in str(info.value)


def test_negative_position_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "0.index"
    _write(path, [(3, -5)])
    with pytest.raises(IndexCorrupt):
        offsetindex.last_entry(path)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(1, 10_000), st.integers(1, 1_000_000)), min_size=0, max_size=300
    ),
    zero_first=st.booleans(),
    tail=st.sampled_from([0, 8, 4096, TEN_MIB]),
)
def test_roundtrip_random_entries(
    steps: list[tuple[int, int]], zero_first: bool, tail: int
) -> None:
    entries: list[tuple[int, int]] = [(0, 0)] if zero_first else []
    rel, pos = 0, 0
    for d_rel, d_pos in steps:
        rel, pos = rel + d_rel, min(pos + d_pos, 2**31 - 1)
        if entries and pos <= entries[-1][1]:
            break
        entries.append((rel, pos))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "0.index"
        _write(path, entries, preallocate=len(entries) * 8 + tail if tail else 0)
        real = [e for e in entries if e != (0, 0)] if len(entries) == 1 else entries
        expected = OffsetIndexEntry(*real[-1]) if real else None
        assert offsetindex.last_entry(path) == expected


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=400))
def test_garbage_gives_an_entry_or_index_corrupt(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "0.index"
        path.write_bytes(data)
        try:
            result = offsetindex.last_entry(path)
        except IndexCorrupt as exc:
            assert str(path) in str(exc)
        else:
            assert result is None or isinstance(result, OffsetIndexEntry)
