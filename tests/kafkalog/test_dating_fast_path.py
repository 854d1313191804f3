"""Dating a cleanly rolled segment the short way gives what the general way gives.

``dating._cleanly_rolled`` answers for the segment nearly every head of a plan is, and
leaves everything else to ``SegmentFileReader._read``. Here both read the same segments,
each bent in one of the ways a log dir can be (files missing, a symlink or a directory in a
file's place, a second hard link, a preallocated or truncated time index, a transaction
index, a segment active at an unclean stop): the ``SegmentInfo`` and the warnings must be
the same, field for field.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diskguard.kafkalog import dating
from diskguard.kafkalog.dating import SegmentFileReader
from diskguard.kafkalog.model import Partition, SegmentInfo, segment_info
from support.kafkagen import SegmentSpec, write_partition

SPECS = [
    SegmentSpec(records=1),
    SegmentSpec(records=10, records_per_batch=10),
    SegmentSpec(records=60, payload_size=2000, records_per_batch=2, timestamp_step_ms=60_000),
]


def _bend(path: Path, base: int, how: str, spare: Path) -> None:
    stem = path / f"{base:020d}"
    log, index, tindex = (Path(f"{stem}{s}") for s in (".log", ".index", ".timeindex"))
    if how == "no index":
        index.unlink()
    elif how == "no log":
        log.unlink()
    elif how == "log is a symlink":
        target = spare / f"log-{base}"
        shutil.move(log, target)
        log.symlink_to(target)
    elif how == "index is a dir":
        index.unlink()
        index.mkdir()
    elif how == "log hard-linked":
        os.link(log, spare / f"link-{base}")
    elif how == "time index hard-linked":
        os.link(tindex, spare / f"tlink-{base}")
    elif how == "time index truncated":
        with open(tindex, "r+b") as fh:
            fh.truncate(max(0, tindex.stat().st_size - 5))
    elif how == "time index preallocated":
        with open(tindex, "r+b") as fh:
            fh.truncate(tindex.stat().st_size + 12 * 100)
    elif how == "time index empty":
        with open(tindex, "r+b") as fh:
            fh.truncate(0)
    elif how == "time index zeroed":
        size = tindex.stat().st_size
        tindex.write_bytes(bytes(size))
    elif how == "txn index":
        Path(f"{stem}.txnindex").write_bytes(b"\0" * 34)
    elif how == "txn index is a symlink":
        Path(f"{stem}.txnindex").symlink_to(log)


BENDS = [
    "none",
    "no index",
    "no log",
    "log is a symlink",
    "index is a dir",
    "log hard-linked",
    "time index hard-linked",
    "time index truncated",
    "time index preallocated",
    "time index empty",
    "time index zeroed",
    "txn index",
    "txn index is a symlink",
]


def _read_both(part: Partition, base: int) -> tuple[tuple[SegmentInfo, list[str]], ...]:
    fast = SegmentFileReader()
    general = SegmentFileReader()
    real = dating._cleanly_rolled
    got_fast = fast(part, base)
    dating._cleanly_rolled = lambda *_args: None  # type: ignore[assignment]
    try:
        got_general = general(part, base)
    finally:
        dating._cleanly_rolled = real  # type: ignore[assignment]
    return (got_fast, fast.warnings), (got_general, general.warnings)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    specs=st.lists(st.sampled_from(SPECS), min_size=2, max_size=4),
    bends=st.lists(st.sampled_from(BENDS), min_size=3, max_size=3),
    unclean=st.booleans(),
    txn=st.booleans(),
)
def test_the_short_way_dates_every_segment_as_the_general_way(
    tmp_path_factory: pytest.TempPathFactory,
    specs: list[SegmentSpec],
    bends: list[str],
    unclean: bool,
    txn: bool,
) -> None:
    root = tmp_path_factory.mktemp("dating")
    spare = root / "spare"
    spare.mkdir()
    layout = write_partition(root, "t", 0, [*specs, SegmentSpec()], simulate_unclean_stop=unclean)
    bases = tuple(s.base_offset for s in layout.segments)
    for seg, how in zip(layout.closed, bends, strict=False):
        _bend(layout.path, seg.base_offset, how, spare)
    part = Partition(str(root), "t", 0, str(layout.path), bases, txn_indexes=txn)
    for base in bases:
        (fast, fast_warnings), (general, general_warnings) = _read_both(part, base)
        assert fast == general, (base, bends)
        assert fast_warnings == general_warnings, (base, bends)


def test_the_short_way_is_taken_for_a_cleanly_rolled_segment(tmp_path: Path) -> None:
    """Not vacuous: the bench's kind of segment is answered by ``_cleanly_rolled``."""
    layout = write_partition(tmp_path, "t", 0, [SPECS[1], SPECS[1], SegmentSpec()])
    part = Partition(str(tmp_path), "t", 0, str(layout.path), layout.base_offsets)
    seg = layout.closed[0]
    fd = os.open(seg.timeindex_path, os.O_RDONLY)
    try:
        info = dating._cleanly_rolled(
            part, seg.base_offset, str(layout.path / f"{seg.base_offset:020d}"), (fd, os.fstat(fd))
        )
    finally:
        os.close(fd)
    assert info is not None
    assert info == SegmentFileReader()(part, seg.base_offset)
    assert (info.max_timestamp_ms, info.timestamp_source) == (seg.max_timestamp_ms, "timeindex")


def test_segment_info_made_the_fast_way_is_the_constructors() -> None:
    args = (4096, 1_700_000_000_000, "timeindex", ("a.log", "a.index"), ("a.log",), ("a.index",))
    made, built = segment_info(*args), SegmentInfo(*args)
    assert made == built
    assert hash(made) == hash(built)
    assert repr(made) == repr(built)
    assert segment_info(*args[:4]) == SegmentInfo(*args[:4])
    with pytest.raises(AttributeError):
        made.bytes = 0  # type: ignore[misc]
