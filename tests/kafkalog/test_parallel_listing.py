"""Listing partition dirs on two cores gives what listing them one by one gives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diskguard.kafkalog import parallellisting
from diskguard.kafkalog.listing import REMOTE_LOG_SNAPSHOT, ListingCache, list_partition
from diskguard.kafkalog.parallellisting import list_in_parallel
from diskguard.kafkalog.scan import scan_log_dir
from support.kafkagen import SegmentSpec, write_partition


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


@pytest.mark.parametrize("full", [False, True], ids=["names", "full"])
def test_every_dir_is_listed_as_alone_with_its_stat_key(tmp_path: Path, full: bool) -> None:
    paths = _odd_tree(tmp_path / "logs")
    got = list_in_parallel(paths, full, force=True)
    assert sorted(got) == sorted(paths)
    for path in paths:
        st = os.stat(path)
        assert got[path] == ((st.st_ino, st.st_mtime_ns), list_partition(path, full))


def test_a_dir_that_cannot_be_listed_carries_its_own_error(tmp_path: Path) -> None:
    paths = _odd_tree(tmp_path / "logs")
    (tmp_path / "logs" / "orders-9").write_text("not a dir")
    odd = [
        *paths[:3],
        str(tmp_path / "logs" / "orders-8"),  # gone
        str(tmp_path / "logs" / "orders-9"),
        *paths[3:],
    ]
    got = list_in_parallel(odd, False, force=True)
    assert isinstance(got[odd[3]], FileNotFoundError) and got[odd[3]].filename == odd[3]
    assert isinstance(got[odd[4]], NotADirectoryError)
    assert all(not isinstance(got[p], OSError) for p in paths)


def test_few_dirs_are_not_worth_a_fork(tmp_path: Path) -> None:
    paths = _odd_tree(tmp_path / "logs")
    assert list_in_parallel(paths, False) == {}  # the scan lists them itself


def test_a_scan_with_a_parallel_cache_is_the_scan_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _odd_tree(tmp_path / "logs")
    (tmp_path / "logs" / "orders-0-delete").mkdir()
    (tmp_path / "logs" / "orders-3.abc-future").mkdir()
    os.symlink(tmp_path / "logs" / "orders-1", tmp_path / "logs" / "orders-20")
    log_dir = str(tmp_path / "logs")
    listed: list[int] = []
    real = parallellisting.list_in_parallel

    def forced(paths: list[str], full: bool) -> dict[str, parallellisting.Listed]:
        listed.append(len(paths))
        return real(paths, full, force=True)  # few dirs: a fork all the same

    monkeypatch.setattr(parallellisting, "list_in_parallel", forced)
    for full in (False, True):
        alone = scan_log_dir(log_dir, "/", [], full=full, cache=ListingCache())
        parallel = scan_log_dir(log_dir, "/", [], full=full, cache=ListingCache(parallel=True))
        assert parallel == alone
    assert listed == [7, 7]  # the live partition dirs, no symlink, no -delete/-future dir
