"""The daemon's inotify hints on a real directory: a broker rewriting its log dir's own
checkpoints (every few seconds, changed or not) is not a partition's change; a segment rolled,
renamed or removed, and a partition dir made or removed, are."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from inotify_simple import INotify, flags

from diskguard.daemon import watch
from diskguard.daemon.watch import HintSummary, Watcher
from diskguard.host import inotifywatches


def _hints(watcher: Watcher, woken: threading.Event) -> HintSummary:
    """What the hints said once one came (inotify is asynchronous), and a moment after, so
    that every event of one change is in."""
    assert woken.wait(30), "no inotify hint within 30 s"
    time.sleep(0.3)
    woken.clear()
    return watcher.take()


@contextmanager
def _watching(log_dir: Path) -> Iterator[tuple[Watcher, threading.Event]]:
    """A watcher over ``log_dir`` and the event its hints set; stopped at the end."""
    woken = threading.Event()
    watcher = Watcher(woken.set)
    watcher.start([log_dir], lambda *_a: None)
    try:
        yield watcher, woken
    finally:
        watcher.stop()


def test_a_log_dirs_own_checkpoints_are_not_a_partitions_change(tmp_path: Path) -> None:
    log_dir = tmp_path / "kafka"
    part = log_dir / "orders-0"
    part.mkdir(parents=True)
    (part / f"{0:020d}.log").write_bytes(b"x")
    woken = threading.Event()
    watcher = Watcher(woken.set)
    watcher.start([log_dir], lambda *_a: None)
    try:
        assert watcher.complete
        # As Kafka writes a checkpoint: a temporary file, written, closed, renamed over.
        tmp = log_dir / "replication-offset-checkpoint.tmp"
        tmp.write_text("0\n1\norders 0 5\n")
        os.replace(tmp, log_dir / "replication-offset-checkpoint")
        hint = _hints(watcher, woken)
        assert hint.structural and not hint.partitions, hint
        # A segment rolled in a partition dir.
        (part / f"{5:020d}.log").write_bytes(b"y")
        hint = _hints(watcher, woken)
        assert hint.structural and hint.partitions, hint
        # A segment renamed for deletion, as the broker does.
        os.replace(part / f"{0:020d}.log", part / f"{0:020d}.log.deleted")
        assert _hints(watcher, woken).partitions
        # A partition dir made in the log dir (a new topic), then one removed.
        (log_dir / "fresh-0").mkdir()
        assert _hints(watcher, woken).partitions
        (log_dir / "fresh-0").rmdir()
        assert _hints(watcher, woken).partitions
        # An append is a size, not a structure: usage shows it.
        with open(part / f"{5:020d}.log", "ab") as f:
            f.write(b"z" * 100)
            f.flush()
            hint = _hints(watcher, woken)
        assert not hint.partitions, hint
    finally:
        watcher.stop()


def test_renames_and_unlinks_reach_the_reclaim_timer_under_their_paths(tmp_path: Path) -> None:
    """The reclaim latency hears a segment renamed to ``.deleted`` and unlinked, with full
    paths, also in a partition dir made after the watch started and after a dir's rename."""
    log_dir = tmp_path / "kafka"
    log_dir.mkdir()
    heard: list[tuple[str, str, str]] = []
    woken = threading.Event()
    watcher = Watcher(woken.set)
    watcher.start([log_dir], lambda kind, src, dest, _t: heard.append((kind, src, dest)))
    try:
        part = log_dir / "orders-0"
        part.mkdir()
        assert _hints(watcher, woken).partitions
        seg = part / f"{0:020d}.log"
        seg.write_bytes(b"x")
        assert _hints(watcher, woken).partitions
        os.replace(seg, f"{seg}.deleted")
        os.unlink(f"{seg}.deleted")
        _hints(watcher, woken)
        assert ("moved", str(seg), f"{seg}.deleted") in heard, heard
        assert ("deleted", f"{seg}.deleted", "") in heard, heard
        # The broker renames a deleted partition's dir: its files are heard under the new name.
        gone = log_dir / "orders-0.abc-delete"
        os.replace(part, gone)
        assert _hints(watcher, woken).partitions
        (gone / "leftover").write_bytes(b"y")
        os.unlink(gone / "leftover")
        _hints(watcher, woken)
        assert ("deleted", str(gone / "leftover"), "") in heard, heard
    finally:
        watcher.stop()


def test_a_lost_event_queue_says_everything_may_have_changed(tmp_path: Path) -> None:
    """The kernel's queue overflowed (``IN_Q_OVERFLOW``): no event can be trusted to be
    missing, so the hint is structural, of partitions, and names every log dir's ``.lock``;
    and it wakes the loop even while quiet (appends alone wait for its poll; what was lost
    may have been a roll or a deletion)."""
    log_dir = tmp_path / "kafka"
    log_dir.mkdir()
    woken = threading.Event()
    watcher = Watcher(woken.set)
    watcher.start([log_dir], lambda *_a: None)
    try:
        reader = watcher._reader
        assert reader is not None
        reader.lazy_appends = True  # the loop while quiet: lost events still wake it
        assert reader._handle([(-1, int(flags.Q_OVERFLOW), 0, "")]), "did not wake the loop"
        hint = watcher.take()
        assert hint.structural and hint.partitions, hint
        assert hint.lock_dirs == {str(log_dir)}
        assert watcher.take() == HintSummary()
    finally:
        watcher.stop()


@pytest.mark.parametrize("how", ["removed", "moved away"])
def test_a_log_dir_whose_watch_went_is_no_longer_complete(tmp_path: Path, how: str) -> None:
    """A log dir removed or moved away takes its watch with it (``IN_DELETE_SELF``,
    ``IN_MOVE_SELF``, ``IN_IGNORED``) and nothing watches what comes at its path: "no hint"
    no longer means "nothing changed", so the stuck back-off and the quiet skip end."""
    log_dir = tmp_path / "kafka"
    (log_dir / "orders-0").mkdir(parents=True)
    with _watching(log_dir) as (watcher, woken):
        assert watcher.complete
        if how == "removed":
            shutil.rmtree(log_dir)
        else:
            os.replace(log_dir, tmp_path / "elsewhere")
        assert _hints(watcher, woken).partitions
        # The log dir's own IN_DELETE_SELF / IN_MOVE_SELF may come in a later batch than the
        # first events of the removal (a loaded machine).
        deadline = time.monotonic() + 30
        while watcher.complete and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not watcher.complete
        log_dir.mkdir()  # a new dir at the old path: not watched
        watcher.verify([log_dir])
        assert not watcher.complete


def test_a_reader_that_stopped_reading_is_not_complete(tmp_path: Path) -> None:
    """The reader thread ending on an error (here the reclaim timer raising) leaves no
    watches read: the watcher no longer claims every change would be hinted."""
    log_dir = tmp_path / "kafka"
    log_dir.mkdir()

    def broken(*_a: object) -> None:
        raise RuntimeError("a bug in a reclaim listener")

    watcher = Watcher(lambda: None)
    watcher.start([log_dir], broken)
    try:
        assert watcher.complete
        reader = watcher._reader
        assert reader is not None
        (log_dir / "x").write_bytes(b"")
        os.unlink(log_dir / "x")
        reader._thread.join(30)
        assert not reader._thread.is_alive()
        assert not watcher.complete
    finally:
        watcher.stop()


def test_a_dir_past_the_watch_limit_is_seen_though_no_dir_count_changed(tmp_path: Path) -> None:
    """A partition dir removed and another made that cannot be watched (``ENOSPC``: the
    watch limit) leaves the log dir's dir count as it was, which ``verify`` used to take as
    "nothing to re-check": the failed add itself now says the watches are incomplete."""
    log_dir = tmp_path / "kafka"
    (log_dir / "orders-0").mkdir(parents=True)
    with _watching(log_dir) as (watcher, woken):
        watcher.verify([log_dir])
        assert watcher.complete
        reader = watcher._reader
        assert reader is not None

        def limit(_path: object, _mask: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        reader._inotify.add_watch = limit  # type: ignore[method-assign]
        (log_dir / "orders-0").rmdir()
        (log_dir / "orders-1").mkdir()
        assert _hints(watcher, woken).partitions
        assert not watcher.complete
        watcher.verify([log_dir])  # the kernel's list: orders-1 is not watched
        assert not watcher.complete


def test_no_descriptor_left_for_the_reader_leaves_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process out of descriptors after inotify's own (``EMFILE`` for the stop pipe):
    no watching, said, nothing raised into the loop, the inotify descriptor closed."""
    log_dir = tmp_path / "kafka"
    log_dir.mkdir()
    made: list[INotify] = []

    def inotify() -> INotify:
        made.append(INotify())
        return made[-1]

    def exhausted(_flags: int) -> tuple[int, int]:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(watch, "INotify", inotify)
    monkeypatch.setattr(os, "pipe2", exhausted)
    watcher = Watcher(lambda: None)
    watcher.start([log_dir], lambda *_a: None)
    assert not watcher.complete
    watcher.stop()
    assert len(made) == 1 and made[0].closed


def test_a_reader_still_busy_at_stop_closes_its_descriptors_when_it_ends(
    tmp_path: Path,
) -> None:
    """``stop`` waits a bounded time; a reader still in a long step then (a re-walk after an
    overflow at a million segments) closes its inotify and pipe itself when it ends."""
    log_dir = tmp_path / "kafka"
    log_dir.mkdir()
    inside, release = threading.Event(), threading.Event()

    def slow(*_a: object) -> None:
        inside.set()
        release.wait(30)

    watcher = Watcher(lambda: None)
    watcher.start([log_dir], slow)
    reader = watcher._reader
    assert reader is not None
    (log_dir / "x").write_bytes(b"")
    os.unlink(log_dir / "x")
    assert inside.wait(30)
    watcher.stop(timeout=0.1)
    assert reader._thread.is_alive() and not reader._inotify.closed
    release.set()
    reader._thread.join(30)
    assert reader._inotify.closed


def test_a_log_dir_named_through_a_symlink_is_watched(tmp_path: Path) -> None:
    """``log.dirs`` often names a symlink to a data disk: the scan follows it (as Kafka
    does), and so does the watch of the log dir itself, never of a dir below it."""
    real = tmp_path / "disk1" / "kafka"
    (real / "orders-0").mkdir(parents=True)
    log_dir = tmp_path / "kafka"
    log_dir.symlink_to(real)
    with _watching(log_dir) as (watcher, woken):
        assert watcher.complete
        (log_dir / "orders-0" / f"{0:020d}.log").write_bytes(b"x")
        assert _hints(watcher, woken).partitions


_DIR_OPS = st.lists(
    st.tuples(
        st.sampled_from(["make", "make_nested", "remove", "to_delete", "move_out", "move_in"]),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=10, deadline=None)
@given(_DIR_OPS)
# Made and renamed before the reader heard of it; made with a dir inside, renamed again and
# again (each one rarely drawn, always tried).
@example([("make", 0), ("to_delete", 1)])
@example([("make_nested", 1), *[("to_delete", 1)] * 6])
def test_complete_means_every_dir_is_watched_whatever_happened(ops: list[tuple[str, int]]) -> None:
    """Whatever dirs were made, removed, renamed for deletion, moved out of the log dir or in
    from elsewhere, once the reader has heard it: if the watcher says ``complete`` (the
    back-off trusts "no hint" then), the kernel watches the log dir and every dir in it,
    before a snapshot's ``verify`` and after it."""
    root = Path(tempfile.mkdtemp(prefix="dg-watchprop-"))
    try:
        log_dir, outside = root / "kafka", root / "outside"
        (log_dir / "orders-0").mkdir(parents=True)
        outside.mkdir()
        with _watching(log_dir) as (watcher, _woken):
            for n, (op, which) in enumerate(ops):
                parts = sorted(p for p in log_dir.iterdir() if p.is_dir())
                part = parts[which % len(parts)] if parts else None
                if op == "make":
                    (log_dir / f"t{n}-{which}").mkdir()
                elif op == "make_nested":
                    (log_dir / f"t{n}-{which}" / "remote_log_snapshot").mkdir(parents=True)
                elif op == "remove" and part is not None:
                    shutil.rmtree(part)
                elif op == "to_delete" and part is not None:
                    part.rename(log_dir / f"{part.name}.{n:032x}-delete")
                elif op == "move_out" and part is not None:
                    part.rename(outside / f"{part.name}-{n}")
                elif op == "move_in":
                    moved = outside / f"in{n}-{which}"
                    (moved / "sub").mkdir(parents=True)
                    moved.rename(log_dir / moved.name)
            time.sleep(0.3)  # the reader hears it all (it reads every 10 ms)
            for verified in (False, True):
                if verified:
                    watcher.verify([log_dir])
                # The log dir and its dirs: nothing deeper holds what a plan reads (a tiered
                # partition's remote_log_snapshot), and verify() checks exactly these.
                dirs = [log_dir, *(p for p in log_dir.iterdir() if p.is_dir())]
                watched = inotifywatches.watched_inodes()
                unwatched = [d for d in dirs if d.stat().st_ino not in watched]
                assert not (watcher.complete and unwatched), (verified, unwatched)
            assert watcher.complete  # nothing here is past the watch limit
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_log_dirs_filesystem_unmounted_is_said_and_not_complete(tmp_path: Path) -> None:
    """``IN_UNMOUNT`` (then ``IN_IGNORED``) for every watch on a filesystem unmounted under
    the daemon (a failed disk lazily unmounted): a hint, and no longer complete; nothing
    will watch the disk mounted there again until a reload."""
    log_dir = tmp_path / "kafka"
    (log_dir / "orders-0").mkdir(parents=True)
    with _watching(log_dir) as (watcher, _woken):
        reader = watcher._reader
        assert reader is not None and watcher.complete
        # The first of the events the kernel sends for each watch on it.
        part = str(log_dir / "orders-0")
        wd = next(wd for wd, path in reader._paths.items() if path == part)
        reader._handle([(wd, int(flags.UNMOUNT), 0, "")])
        assert watcher.take().partitions
        assert not watcher.complete


def _touched_until(watcher: Watcher, names: set[str]) -> frozenset[str] | None:
    """What ``take_touched`` named, taken until ``names`` are all in or 30 s passed (events
    come asynchronously, maybe in several batches)."""
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while not names <= seen and time.monotonic() < deadline:
        touched = watcher.take_touched()
        if touched is None:
            return None
        seen |= touched
        time.sleep(0.05)
    return frozenset(seen)


def test_the_dirs_any_event_touched_appends_included_are_named_until_taken(
    tmp_path: Path,
) -> None:
    """What a snapshot while quiet re-reads (``take_touched``): the names of the partition
    dirs with any event since the last call, an append included; nothing is named before the
    first call (the scan before it read everything), and lost events name everything."""
    log_dir = tmp_path / "kafka"
    for name in ("orders-0", "orders-1", "audit-0"):
        (log_dir / name).mkdir(parents=True)
        (log_dir / name / f"{0:020d}.log").write_bytes(b"x")
    partitions = {"orders-0", "orders-1", "audit-0"}
    with _watching(log_dir) as (watcher, woken):
        assert watcher.take_touched() is None  # the first: any dir may have changed
        with open(log_dir / "orders-1" / f"{0:020d}.log", "ab") as segment:
            segment.write(b"appended")
        (log_dir / "audit-0" / "leader-epoch-checkpoint").write_text("0\n0\n")
        _hints(watcher, woken)
        touched = _touched_until(watcher, {"orders-1", "audit-0"})
        assert touched is not None and touched & partitions == {"orders-1", "audit-0"}
        # The log dir's own checkpoint names no partition dir; orders-0 had no event.
        (log_dir / "replication-offset-checkpoint").write_text("0\n0\n")
        _hints(watcher, woken)
        touched = watcher.take_touched()
        assert touched is not None and "orders-0" not in touched
        reader = watcher._reader
        assert reader is not None
        reader._handle([(-1, int(flags.Q_OVERFLOW), 0, "")])
        assert watcher.take_touched() is None
        touched = watcher.take_touched()  # afresh after it
        assert touched is not None and "orders-0" not in touched


def test_no_dir_is_taken_as_untouched_while_some_dir_is_not_watched(tmp_path: Path) -> None:
    log_dir = tmp_path / "kafka"
    (log_dir / "orders-0").mkdir(parents=True)
    with _watching(log_dir) as (watcher, _woken):
        watcher.take_touched()
        assert watcher.take_touched() == frozenset()
        reader = watcher._reader
        assert reader is not None
        reader.lost = True  # as after a log dir's own watch went
        assert not watcher.complete
        assert watcher.take_touched() is None


def test_while_lazy_appends_alone_wake_nobody_but_are_still_named(tmp_path: Path) -> None:
    """The loop while quiet (``Watcher.lazy``): its usage poll sees appended bytes, so an
    append alone does not wake it; the dir is still named for the next snapshot, and any
    other change (here a segment rolled) wakes it at once."""
    log_dir = tmp_path / "kafka"
    (log_dir / "orders-0").mkdir(parents=True)
    active = log_dir / "orders-0" / f"{0:020d}.log"
    active.write_bytes(b"x")
    # Held open as a broker holds its active segment: an append is IN_MODIFY alone (a close
    # after writing is a change: IN_CLOSE_WRITE).
    fd = os.open(active, os.O_WRONLY | os.O_APPEND)
    try:
        with _watching(log_dir) as (watcher, woken):
            watcher.take_touched()
            watcher.lazy = True
            assert watcher.lazy
            os.write(fd, b"appended")
            assert _touched_until(watcher, {"orders-0"}) == {"orders-0"}
            assert not woken.wait(0.5), "an append woke the loop while lazy"
            (log_dir / "orders-0" / f"{9:020d}.log").write_bytes(b"")  # a roll
            _hints(watcher, woken)
            watcher.lazy = False
            os.write(fd, b"appended")
            _hints(watcher, woken)
    finally:
        os.close(fd)


def test_while_lazy_a_log_dirs_own_checkpoints_wake_nobody_but_are_still_said(
    tmp_path: Path,
) -> None:
    """A broker rewrites ``replication-offset-checkpoint`` every 5 s whether or not anything
    changed: while quiet that alone does not wake the loop (its usage poll comes within a
    second); the hint still says it (structural, not a partition's), and a partition dir's
    change wakes the loop at once; once not lazy, a checkpoint wakes it again."""
    log_dir = tmp_path / "kafka"
    (log_dir / "orders-0").mkdir(parents=True)

    def checkpoint() -> None:
        tmp = log_dir / "replication-offset-checkpoint.tmp"
        tmp.write_text("0\n1\norders 0 5\n")
        os.replace(tmp, log_dir / "replication-offset-checkpoint")

    with _watching(log_dir) as (watcher, woken):
        watcher.take_touched()
        watcher.lazy = True
        checkpoint()
        assert _touched_until(watcher, {"replication-offset-checkpoint"}) is not None
        assert not woken.wait(0.5), "a checkpoint woke the loop while lazy"
        hint = watcher.take()
        assert hint.structural and not hint.partitions, hint
        (log_dir / "orders-0" / f"{9:020d}.log").write_bytes(b"")  # a roll
        assert _hints(watcher, woken).partitions
        watcher.lazy = False
        checkpoint()
        hint = _hints(watcher, woken)
        assert hint.structural and not hint.partitions, hint


def test_a_partitions_leader_epoch_checkpoint_is_not_a_change_of_it(tmp_path: Path) -> None:
    """A broker starting (or leaders moving) rewrites every partition's
    ``leader-epoch-checkpoint``, for minutes at thousands of partitions: no plan reads it, so
    the quiet daemon stays quiet and is not woken; the dir is still named (its listing is
    read again by the next snapshot). Any other file made there still is a change."""
    log_dir = tmp_path / "kafka"
    part = log_dir / "orders-0"
    part.mkdir(parents=True)
    (part / f"{0:020d}.log").write_bytes(b"x")
    with _watching(log_dir) as (watcher, woken):
        watcher.take_touched()
        watcher.lazy = True
        tmp = part / "leader-epoch-checkpoint.tmp"
        tmp.write_text("0\n1\n0 0\n")
        os.replace(tmp, part / "leader-epoch-checkpoint")
        assert _touched_until(watcher, {"orders-0"}) == {"orders-0"}
        assert not woken.wait(0.5), "a leader-epoch-checkpoint woke the loop while lazy"
        assert watcher.take() == HintSummary()
        (part / f"{9:020d}.log").write_bytes(b"")  # a roll
        hint = _hints(watcher, woken)
        assert hint.structural and hint.partitions, hint


def test_verify_counts_the_dirs_the_scan_listed_and_lists_again_only_on_a_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With each checked snapshot ``verify`` needs only the log dir's dir count while it stays
    the same: the scan listed 9,000 dirs a moment before, so it takes that listing's count;
    a count that changed (a partition made since) lists the log dir again and asks the
    kernel, as does a listing that is not there."""
    log_dir = tmp_path / "kafka"
    for p in range(2):
        (log_dir / f"orders-{p}").mkdir(parents=True)
    (log_dir / "replication-offset-checkpoint").write_text("0\n0\n")
    listings: list[Path] = []
    fresh = watch._dirs_of

    def counted(path: Path) -> list[tuple[str, int]]:
        listings.append(path)
        return fresh(path)

    def scanned(key: str) -> list[os.DirEntry[str]]:
        assert key == str(log_dir)
        return sorted(os.scandir(log_dir), key=lambda e: e.name)

    with _watching(log_dir) as (watcher, woken):
        assert watcher.complete
        monkeypatch.setattr(watch, "_dirs_of", counted)
        watcher.verify([log_dir], scanned)
        assert listings == [] and watcher.complete
        watcher.verify([log_dir], lambda _key: None)  # not listed: listed here
        assert listings == [log_dir] and watcher.complete
        (log_dir / "orders-2").mkdir()
        assert _hints(watcher, woken).partitions  # watched as it came
        watcher.verify([log_dir], scanned)
        assert listings == [log_dir, log_dir] and watcher.complete
        watcher.verify([log_dir], scanned)
        assert len(listings) == 2
