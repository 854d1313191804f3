"""The guard rails' listing of a partition dir: one regex over all names finds exactly the
names ``parse_segment_file`` accepts, with their file types, as the per-name loop did."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.kafkalog.model import parse_segment_file
from diskguard.retention.offline.guards import SegmentDirListing, _file_type

_SUFFIXES = [".log", ".index", ".timeindex", ".txnindex", ".snapshot", ".deleted", ".log.deleted"]
_NAMES = st.one_of(
    st.builds(lambda n, sfx: f"{n:020d}{sfx}", st.integers(0, 10**6), st.sampled_from(_SUFFIXES)),
    st.builds(lambda n, sfx: f"{n}{sfx}", st.integers(0, 10**6), st.sampled_from(_SUFFIXES)),
    st.text(alphabet="0123456789.logindex\n١", min_size=1, max_size=30),
)
_KINDS = st.sampled_from(["file", "dir", "symlink", "fifo"])


def _reference(part_dir: str) -> SegmentDirListing:
    """The listing as first written: every name parsed on its own."""
    modes: dict[str, int] = {}
    with os.scandir(part_dir) as entries:
        for entry in entries:
            if parse_segment_file(entry.name) is None:
                continue
            modes[entry.name] = _file_type(entry)
    return SegmentDirListing(modes)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_NAMES, _KINDS, max_size=25))
def test_the_listing_is_the_per_name_listing(entries: dict[str, str]) -> None:
    root = Path(tempfile.mkdtemp(prefix="dg-segdir-"))
    try:
        for name, kind in entries.items():
            if name in (".", "..") or "/" in name or "\0" in name:
                continue
            path = root / name
            if kind == "file":
                path.write_bytes(b"")
            elif kind == "dir":
                path.mkdir()
            elif kind == "symlink":
                path.symlink_to("/etc/hostname")
            else:
                os.mkfifo(path)
        fast, slow = SegmentDirListing.of(str(root)), _reference(str(root))
        assert fast.modes == slow.modes
        assert fast.logs == slow.logs
        assert all(stat.S_ISREG(fast.modes[f"{b:020d}.log"]) for b in fast.logs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_one_definition_of_a_segment_name_serves_both() -> None:
    """The listing's regex is built from the model's definition, not a copy of its suffixes:
    a suffix added to the model is found by the guard rails too."""
    from diskguard.kafkalog import model
    from diskguard.retention.offline import guards

    assert model.SEGMENT_NAME_PATTERN in guards._SEGMENT_NAMES.pattern
    for suffix in (*model.SEGMENT_FILE_SUFFIXES, model.SNAPSHOT_SUFFIX):
        name = f"{42:020d}{suffix}"
        assert parse_segment_file(name) == (42, suffix)
        assert guards._SEGMENT_NAMES.findall(f"/{name}/") == [name]
