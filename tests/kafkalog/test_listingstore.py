"""Listings kept between plans: taken only for a dir unchanged since, never damaged ones."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from diskguard.kafkalog import listingstore, parallellisting
from diskguard.kafkalog.listing import PartitionListing, list_partition
from diskguard.kafkalog.listingstore import SETTLE_S, STORE_NAME, ListingStore, stamp, storable
from support.kafkagen import SegmentSpec, write_partition

#: Past every coarse file-time tick: a change made after this sleep has a ``ctime`` of its own.
TICK_S = 0.05


def _settled(st: os.stat_result) -> listingstore.Stamp:
    """The stamp of a dir as if it had not changed for longer than ``SETTLE_S``."""
    got = stamp(st, st.st_ctime_ns / 1e9 + SETTLE_S + 1)
    assert got is not None
    return got


def _dirs(root: Path) -> list[str]:
    """Partition dirs of every kind a names-only listing tells apart."""
    plain = str(write_partition(root, "plain", 0, [SegmentSpec(records=3)] * 5).path)
    txn = str(write_partition(root, "txn", 0, [SegmentSpec(records=3)] * 3).path)
    (Path(txn) / f"{0:020d}.txnindex").write_bytes(b"")
    remote = str(write_partition(root, "remote", 0, [SegmentSpec(records=3)] * 2).path)
    (Path(remote) / "remote_log_snapshot").mkdir()
    odd = str(write_partition(root, "odd", 0, [SegmentSpec(records=3)] * 3).path)
    (Path(odd) / f"{99:020d}.log").mkdir()  # a dir named like a segment is never one
    os.symlink("/nowhere", Path(odd) / f"{98:020d}.log")
    (Path(odd) / "partition.metadata").unlink()
    empty = root / "empty-0"
    empty.mkdir()
    return [plain, txn, remote, odd, str(empty)]


def _kept(paths: list[str]) -> list[tuple[str, listingstore.Stamp, PartitionListing]]:
    return [(p, _settled(os.stat(p)), list_partition(p, False)) for p in paths]


def test_a_kept_listing_is_the_dir_s_own_while_it_is_unchanged(tmp_path: Path) -> None:
    paths = _dirs(tmp_path / "logs")
    listingstore.save(tmp_path, _kept(paths))
    store = listingstore.load(tmp_path)
    assert len(store) == len(paths)
    for path in paths:
        assert store.get(path, os.stat(path)) == list_partition(path, False)


@pytest.mark.parametrize("change", ["made", "removed", "renamed", "mtime put back", "replaced"])
def test_any_change_to_a_dir_since_is_seen(tmp_path: Path, change: str) -> None:
    path = str(write_partition(tmp_path / "logs", "orders", 0, [SegmentSpec(records=3)] * 4).path)
    before = os.stat(path)
    listingstore.save(tmp_path, _kept([path]))
    time.sleep(TICK_S)
    seg = Path(path) / f"{3:020d}.log"
    if change == "made":
        (Path(path) / f"{100:020d}.log").write_bytes(b"")
    elif change == "removed":
        seg.unlink()
    elif change == "renamed":
        seg.rename(seg.with_name(seg.name + ".deleted"))
    elif change == "mtime put back":  # a restore that sets the dir's old mtime again
        seg.unlink()
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    else:  # removed and made again: inode numbers are reused
        os.rename(path, path + ".old")
        os.mkdir(path)
    assert listingstore.load(tmp_path).get(path, os.stat(path)) is None


def test_a_dir_changed_within_the_settle_time_is_not_kept(tmp_path: Path) -> None:
    path = str(write_partition(tmp_path / "logs", "orders", 0, [SegmentSpec(records=3)] * 2).path)
    st = os.stat(path)
    assert stamp(st) is None  # just made
    assert stamp(st, st.st_ctime_ns / 1e9 + SETTLE_S / 2) is None
    assert stamp(st, st.st_ctime_ns / 1e9 - 60) is None  # a clock set back: not settled

    # Times in whole seconds (a filesystem without nanoseconds): never kept, since a clock
    # set back could bring the same times again with other names in the dir.
    def at(ns: int) -> os.stat_result:
        return os.stat_result(st[:10], {"st_mtime_ns": ns, "st_ctime_ns": ns})

    assert stamp(at(1_700_000_000 * 10**9), 1_700_000_100) is None
    assert stamp(at(1_700_000_000 * 10**9 + 1), 1_700_000_100) is not None
    # ... nor taken from a store that kept one all the same (made before that rule)
    listing = list_partition(path, False)
    for ns in (1_700_000_000 * 10**9, 1_700_000_000 * 10**9 + 1):
        store = ListingStore({path: ((st.st_dev, st.st_ino, ns, ns), listing)})
        assert store.get(path, at(ns)) == (None if ns % 10**9 == 0 else listing)
    assert stamp(st, st.st_ctime_ns / 1e9 + SETTLE_S + 0.1) == (
        st.st_dev,
        st.st_ino,
        st.st_mtime_ns,
        st.st_ctime_ns,
    )


def test_deleted_files_and_full_listings_are_not_kept(tmp_path: Path) -> None:
    path = str(write_partition(tmp_path / "logs", "orders", 0, [SegmentSpec(records=3)] * 3).path)
    assert storable(list_partition(path, False))
    assert not storable(list_partition(path, True))
    seg = Path(path) / f"{0:020d}.log"
    seg.rename(seg.with_name(seg.name + ".deleted"))
    assert not storable(list_partition(path, False))


def _damaged(data: bytes) -> list[bytes]:
    magic, rest = data[: len(listingstore.MAGIC)], data[len(listingstore.MAGIC) :]
    flipped = bytearray(data)
    flipped[-3] ^= 0x40
    return [
        b"",
        data[:-1],
        data[: len(data) // 2],
        bytes(flipped),
        b"something else\n" + rest,
        magic + b"00000000\n" + rest[9:],
    ]


def _forged(header: bytes, bases: bytes) -> bytes:
    """A store with a good checksum around a bad content."""
    import zlib

    body = header + b"\n" + bases
    return listingstore.MAGIC + b"%08x\n" % zlib.crc32(body) + body


def test_a_damaged_or_forged_store_is_no_store(tmp_path: Path) -> None:
    paths = _dirs(tmp_path / "logs")
    listingstore.save(tmp_path, _kept(paths))
    good = (tmp_path / STORE_NAME).read_bytes()
    q = (5).to_bytes(8, "little") + (3).to_bytes(8, "little")
    bad = [
        *_damaged(good),
        _forged(b'{"a": 1}', b""),
        _forged(b'[["/x", 1, 2, 3, 4, 0, 2]]', q),  # bases out of order
        _forged(b'[["/x", 1, 2, 3, 4, 0, 3]]', q),  # more bases than there are
        _forged(b'[["/x", 1, 2, 3, 4, 0, 1]]', q),  # bases left over
        _forged(b'[["/x", 1, 2, 3, 4, 0, -1]]', q),
        _forged(b'[["/x", 1, 2, 3.5, 4, 0, 0]]', b""),
        _forged(b"[[7, 1, 2, 3, 4, 0, 0]]", b""),
        _forged(b'[["/x", 1, 2, 3, 4, 0]]', b""),
        _forged(b"[[", b""),
        _forged(b"[]", b"\x00" * 7),
    ]
    for data in bad:
        (tmp_path / STORE_NAME).write_bytes(data)
        assert len(listingstore.load(tmp_path)) == 0, data[:80]
    (tmp_path / STORE_NAME).unlink()
    (tmp_path / STORE_NAME).symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(good)
    assert len(listingstore.load(tmp_path)) == 0  # never followed


def test_saving_where_it_cannot_be_written_does_nothing(tmp_path: Path) -> None:
    paths = _dirs(tmp_path / "logs")
    listingstore.save(tmp_path / "missing", _kept(paths))
    assert not (tmp_path / "missing").exists()
    in_the_way = tmp_path / "a"
    in_the_way.mkdir()
    (in_the_way / f".{STORE_NAME}.{os.getpid()}.tmp").mkdir()  # the temp file cannot be made
    listingstore.save(in_the_way, _kept(paths))
    assert not (in_the_way / STORE_NAME).exists()
    taken = tmp_path / "b"
    (taken / STORE_NAME / "x").mkdir(parents=True)  # the store's name is a dir's
    listingstore.save(taken, _kept(paths))
    assert sorted(os.listdir(taken)) == [STORE_NAME]  # no temp file left behind


def test_nothing_is_kept_on_a_filesystem_short_of_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _dirs(tmp_path / "logs")
    free = os.statvfs(tmp_path)
    monkeypatch.setattr(listingstore, "MIN_FREE_BYTES", free.f_bavail * free.f_frsize * 2)
    listingstore.save(tmp_path, _kept(paths))
    assert not (tmp_path / STORE_NAME).exists()
    monkeypatch.setattr(listingstore, "MIN_FREE_BYTES", 0)
    listingstore.save(tmp_path, _kept(paths))
    assert len(listingstore.load(tmp_path)) == len(paths)


def test_a_listing_is_taken_from_the_store_where_the_dir_is_unchanged(tmp_path: Path) -> None:
    """The plan's worker's way (``parallellisting._listed``): what the store holds for an
    unchanged dir is taken as it is (a changed dir is listed afresh), and what is listed
    afresh is offered for keeping under the stamp of its ``stat``."""
    paths = _dirs(tmp_path / "logs")
    plain = paths[0]
    fake = PartitionListing((1, 2, 3), 0, 0, (), False)  # not what the dir holds
    store = ListingStore({plain: (_settled(os.stat(plain)), fake)})
    parallellisting.use_store(store)
    try:
        (got, kept) = parallellisting._listed(plain, False)
        assert not isinstance(got, OSError)
        assert got[1] == fake and kept == (_settled(os.stat(plain)), False)
        (got, kept) = parallellisting._listed(plain, True)  # a full listing: never kept
        assert not isinstance(got, OSError)
        assert got[1] == list_partition(plain, True) and kept == (None, True)
        time.sleep(TICK_S)
        (Path(plain) / f"{100:020d}.log").write_bytes(b"")
        (got, kept) = parallellisting._listed(plain, False)
        assert not isinstance(got, OSError)
        assert got[1] == list_partition(plain, False)
        assert kept == (None, True)  # changed just now: not kept
    finally:
        parallellisting.use_store(None)


def test_saving_never_writes_through_what_is_planted_under_the_temp_name(tmp_path: Path) -> None:
    """Whoever can write in the state dir can make the temp file's name (the pid is no
    secret) a hard link to another file, or a symlink: saving makes a file of its own and
    leaves the other as it was."""
    paths = _dirs(tmp_path / "logs")
    state = tmp_path / "state"
    state.mkdir()
    other = tmp_path / "other"
    other.write_bytes(b"someone else's\n")
    tmp = state / f".{STORE_NAME}.{os.getpid()}.tmp"
    os.link(other, tmp)
    listingstore.save(state, _kept(paths))
    assert other.read_bytes() == b"someone else's\n"
    assert os.stat(other).st_nlink == 1
    assert len(listingstore.load(state)) == len(paths)
    assert (os.stat(state / STORE_NAME).st_mode & 0o777) == 0o600
    os.symlink(other, tmp)
    listingstore.save(state, _kept(paths))
    assert other.read_bytes() == b"someone else's\n"
    assert sorted(os.listdir(state)) == [STORE_NAME]


def test_a_killed_plan_s_temp_file_goes_with_the_next_save_and_nothing_else(
    tmp_path: Path,
) -> None:
    """A plan killed while saving leaves its temp file; the next plan's save removes it once
    no process has its pid, and never a live plan's temp file or any other name."""
    import subprocess
    import sys

    paths = _dirs(tmp_path / "logs")
    state = tmp_path / "state"
    state.mkdir()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = int(gone.stdout)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            f".{STORE_NAME}.{dead}.tmp": False,  # killed mid-save: removed
            f".{STORE_NAME}.{live.pid}.tmp": True,  # saving now: kept
            f".{STORE_NAME}.0{dead}.tmp": True,  # not a name a plan makes
            f".{STORE_NAME}.{dead}": True,
            f".{STORE_NAME}.x{dead}.tmp": True,
            f"{STORE_NAME}.{dead}.tmp": True,
            "journal.tmp": True,
        }
        for name in names:
            (state / name).write_bytes(b"x")
        listingstore.save(state, _kept(paths))
        for name, kept in names.items():
            assert (state / name).exists() == kept, name
        assert len(listingstore.load(state)) == len(paths)
    finally:
        live.kill()
        live.wait()


def test_a_store_another_user_made_is_no_store(tmp_path: Path) -> None:
    paths = _dirs(tmp_path / "logs")
    listingstore.save(tmp_path, _kept(paths))
    assert len(listingstore.load(tmp_path)) == len(paths)
    os.chown(tmp_path / STORE_NAME, os.geteuid() + 1, -1)
    assert len(listingstore.load(tmp_path)) == 0
    os.chown(tmp_path / STORE_NAME, os.geteuid(), -1)
    assert len(listingstore.load(tmp_path)) == len(paths)


def test_a_base_past_eight_bytes_is_never_kept_nor_fails_the_save(tmp_path: Path) -> None:
    """A stray ``99999999999999999999.log`` (20 digits, past 2^63) in a partition dir: its
    listing is not kept, and one offered all the same leaves neither a store nor a temp
    file behind, nor an error (``plan`` would exit 1 after its output)."""
    paths = _dirs(tmp_path / "logs")
    (Path(paths[0]) / f"{10**20 - 1}.log").write_bytes(b"")
    odd = list_partition(paths[0], False)
    assert odd.bases[-1] == 10**20 - 1 and not storable(odd)
    largest = PartitionListing((0, (1 << 63) - 1), 0, 0, (), False)
    assert storable(largest)
    state = tmp_path / "state"
    state.mkdir()
    listingstore.save(state, [(paths[0], _settled(os.stat(paths[0])), odd)])
    assert os.listdir(state) == []
    listingstore.save(state, [(paths[0], _settled(os.stat(paths[0])), largest)])
    assert listingstore.load(state).get(paths[0], os.stat(paths[0])) == largest
