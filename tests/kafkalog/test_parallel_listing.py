"""Listing partition dirs on two cores gives what listing them one by one gives."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from diskguard.host.forked import Worker
from diskguard.kafkalog import parallellisting
from diskguard.kafkalog.listing import REMOTE_LOG_SNAPSHOT, ListingCache, list_partition
from diskguard.kafkalog.parallellisting import list_in_parallel
from diskguard.kafkalog.scan import scan_log_dir
from support.kafkagen import SegmentSpec, write_partition
from support.workerplan import forced_worker


def _odd_tree(root: Path) -> list[str]:
    """Partitions with what a listing must notice: a FIFO named like a segment, ``.deleted``
    files (one hard-linked from outside), a ``.txnindex``, tiered-storage state."""
    paths = []
    for p in range(7):
        layout = write_partition(root, "orders", p, [SegmentSpec(records=5)] * (2 + p % 3))
        paths.append(str(layout.path))
    orders0, orders1, orders2 = (root / f"orders-{p}" for p in range(3))
    os.mkfifo(orders0 / f"{99:020d}.log")
    (orders1 / f"{0:020d}.log.deleted").write_bytes(b"y" * 5000)
    (orders1 / f"{0:020d}.index.deleted").write_bytes(b"z" * 100)
    os.link(orders1 / f"{0:020d}.index.deleted", root.parent / "backup")
    (orders2 / f"{5:020d}.txnindex").write_bytes(bytes(34))
    (orders2 / REMOTE_LOG_SNAPSHOT).mkdir()
    return paths


@pytest.fixture
def worker() -> Iterator[Worker]:
    with forced_worker() as made:
        yield made


@pytest.mark.parametrize("full", [False, True], ids=["names", "full"])
def test_every_dir_is_listed_as_alone_with_its_stat_key(
    tmp_path: Path, full: bool, worker: Worker
) -> None:
    paths = _odd_tree(tmp_path / "logs")
    got = list_in_parallel(paths, full, worker, force=True)
    assert sorted(got) == sorted(paths)
    for path in paths:
        st = os.stat(path)
        assert got[path] == ((st.st_ino, st.st_mtime_ns), list_partition(path, full))


def test_a_dir_that_cannot_be_listed_carries_its_own_error(tmp_path: Path, worker: Worker) -> None:
    paths = _odd_tree(tmp_path / "logs")
    (tmp_path / "logs" / "orders-9").write_text("not a dir")
    odd = [
        *paths[:3],
        str(tmp_path / "logs" / "orders-8"),  # gone
        str(tmp_path / "logs" / "orders-9"),
        *paths[3:],
    ]
    got = list_in_parallel(odd, False, worker, force=True)
    assert isinstance(got[odd[3]], FileNotFoundError) and got[odd[3]].filename == odd[3]
    assert isinstance(got[odd[4]], NotADirectoryError)
    assert all(not isinstance(got[p], OSError) for p in paths)


def test_few_dirs_or_no_worker_are_listed_by_the_scan_itself(
    tmp_path: Path, worker: Worker
) -> None:
    paths = _odd_tree(tmp_path / "logs")
    assert list_in_parallel(paths, False, worker) == {}
    assert list_in_parallel(paths, False, None, force=True) == {}


def test_a_scan_with_a_parallel_cache_is_the_scan_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker: Worker
) -> None:
    _odd_tree(tmp_path / "logs")
    (tmp_path / "logs" / "orders-0-delete").mkdir()
    (tmp_path / "logs" / "orders-3.abc-future").mkdir()
    os.symlink(tmp_path / "logs" / "orders-1", tmp_path / "logs" / "orders-20")
    log_dir = str(tmp_path / "logs")
    monkeypatch.setattr(parallellisting, "MIN_DIRS", 0)  # few dirs: the worker all the same
    for full in (False, True):
        alone = scan_log_dir(log_dir, "/", [], full=full, cache=ListingCache())
        parallel = ListingCache(worker=worker)
        assert scan_log_dir(log_dir, "/", [], full=full, cache=parallel) == alone
        assert parallel.misses == 7  # the live partition dirs, no symlink, no -delete/-future
        # Begun early (before a plan's broker round trips), taken by the scan.
        early = ListingCache(worker=worker)
        early.start_early([log_dir], full)
        assert scan_log_dir(log_dir, "/", [], full=full, cache=early) == alone
        # Begun early for names only, the scan stats every file: the worker's are not used.
        names = ListingCache(worker=worker)
        names.start_early([log_dir], False)
        assert scan_log_dir(log_dir, "/", [], full=True, cache=names) == scan_log_dir(
            log_dir, "/", [], full=True, cache=ListingCache()
        )


def test_a_dir_made_after_the_early_listing_is_listed_by_the_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker: Worker
) -> None:
    _odd_tree(tmp_path / "logs")
    log_dir = str(tmp_path / "logs")
    monkeypatch.setattr(parallellisting, "MIN_DIRS", 0)
    early = ListingCache(worker=worker)
    early.start_early([log_dir], False)
    write_partition(tmp_path / "logs", "late", 0, [SegmentSpec(records=5)] * 3)
    scanned = scan_log_dir(log_dir, "/", [], cache=early)
    assert scanned == scan_log_dir(log_dir, "/", [], cache=ListingCache())
    assert [p.topic for p in scanned.partitions].count("late") == 1


def test_the_two_ends_meet_and_each_dir_wanted_is_listed_as_alone(
    tmp_path: Path, worker: Worker
) -> None:
    """The worker from the first dir on, this process from the last back (``Claims``): a
    subset wanted, a dir the worker was never given, both listed as one by one."""
    root = tmp_path / "logs"
    paths = [
        str(write_partition(root, "t", p, [SegmentSpec(records=2)] * 3).path) for p in range(40)
    ]
    extra = str(write_partition(root, "u", 0, [SegmentSpec(records=2)] * 2).path)
    early = parallellisting.EarlyListing.start(paths, False, worker, force=True)
    assert early is not None
    wanted = [*paths[::3], extra]
    got = early.take(wanted)
    for path in wanted:
        st = os.stat(path)
        assert got[path] == ((st.st_ino, st.st_mtime_ns), list_partition(path, False))
    assert early.take(wanted) == {}
