"""Removing a segment's files crash-safely: rename each to ``<name>.deleted`` (``.log``
first), unlink, fsync the partition dir (a single ``remove`` fsyncs after the renames too).

``.log`` goes first because from that moment Kafka no longer sees the segment: if the broker
starts before recovery has run, its log loading deletes ``*.deleted`` files and orphaned index
files by itself instead of rebuilding indexes of a half-deleted segment. A batch renames in
plan order, so whatever a crash interrupts, the segments already started form a prefix of the
plan. A file that refuses its rename for good (an immutable index) gets the segment's
renamed files renamed back (``SegmentRestored``): the segment stays whole instead of losing
its records to that start-up cleanup. Freed bytes are allocated blocks (``st_blocks * 512``)
of files with a single link; a file that vanished meanwhile is fine and counts 0 bytes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from diskguard.host.fsjournal import commits_in_order
from diskguard.kafkalog.model import DELETED_SUFFIX
from diskguard.retention.offline.guards import unlink_frees

#: Test hook: called with a step name before each step that changes the disk.
StepHook = Callable[[str], None]

_HOLE_IO = "not deleted: an older segment of this partition failed first (no hole)"
#: A rename that fails with these fails again until someone changes the file or its dir (an
#: immutable or append-only flag: EPERM even for root; a dir diskguard may not write:
#: EACCES). Not EROFS or EIO: those are the whole filesystem's, for the stuck tracker.
LASTING_ERRNOS = frozenset({errno.EPERM, errno.EACCES})


class SegmentRestored(OSError):
    """Renaming one of a segment's files failed and the ones renamed before it were renamed
    back: the segment is whole, as if never touched (``SegmentRemover.rename_all``)."""


def os_error_text(exc: OSError, directory: str) -> str:
    """``"Operation not permitted (/data/kafka/orders-0/00000000000000000000.log)"``: the
    steps work relative to the dir's descriptor, so ``exc.filename`` is a bare name; the
    message names the whole path (the audit, ``plan`` and ``status`` show which partition)."""
    name = exc.filename
    where = (
        os.path.join(directory, os.fsdecode(name)) if isinstance(name, str | bytes) else directory
    )
    return f"{exc.strerror or exc} ({where})"


class SegmentRemover:
    """The rename/fsync/unlink steps, each announced to ``on_step`` (crash-point tests)."""

    def __init__(self, on_step: StepHook | None = None) -> None:
        self._on_step = on_step
        self._in_order: dict[int, bool] = {}

    def commits_in_order(self, dev: int) -> bool:
        """``fsjournal.commits_in_order``, asked once per device."""
        if dev not in self._in_order:
            self._in_order[dev] = commits_in_order(dev)
        return self._in_order[dev]

    def start_batch(self, subs: Sequence[Mapping[str, Any]]) -> StartedBatch:
        """Every rename (plan order), then every unlink of a batch; nothing fsync'd yet
        (``finish_batch`` does that). Its partition dirs stay open in the result.

        No fsync between the renames and the unlinks (each cost a cache flush, behind a
        writer 0.1-0.4 s): the batch is durably
        intended before anything moves (journal entry and audit intents fsync'd), so a
        power loss may leave any mix of renamed and unlinked files of it and recovery
        finishes the started segments, closing each partition's started set to a prefix
        (``recovery``). That fsync was the one a crossing waited on before any space came
        back: behind a writer it waits for the filesystem's journal commit. An I/O error
        renaming one segment stops that partition's later segments (never a hole): they
        are left untouched. A segment one of whose files refuses the rename is renamed back
        whole where it can be (``rename_all``) and counts as untouched; one that failed
        once started otherwise is left to ``recover``, which finishes it."""
        b = StartedBatch(subs)
        stopped: dict[str, str] = {}  # partition dir -> the rename error that stopped it
        renamed: list[list[tuple[str, bool]]] = [[] for _ in subs]  # (name, unlinked already)
        try:
            for k, sub in enumerate(subs):
                pd = str(sub["partition_dir"])
                if pd in stopped:
                    b.errors[k], b.untouched[k] = f"{_HOLE_IO}: {stopped[pd]}", True
                    continue
                try:
                    if pd not in b.fds:
                        b.fds[pd] = os.open(
                            pd, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                        )
                    b.freed[k] = self.rename_all(b.fds[pd], sub["names"], renamed[k])
                except OSError as exc:
                    b.errors[k] = stopped[pd] = os_error_text(exc, pd)
                    b.lasting[k] = exc.errno in LASTING_ERRNOS
                    # Whole again: settled as not deleted, nothing left for ``recover``.
                    b.untouched[k] = isinstance(exc, SegmentRestored)
                finally:
                    if pd in b.fds:  # a dir that could not be opened was not changed
                        _touch(b.touched, pd)
            for k, sub in enumerate(subs):
                pd = str(sub["partition_dir"])
                if b.errors[k] is not None:
                    continue
                try:
                    for name, unlinked in renamed[k]:
                        if unlinked:
                            continue
                        self.step(f"unlink:{name}")
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(name + DELETED_SUFFIX, dir_fd=b.fds[pd])
                except OSError as exc:
                    # Its .log is renamed already: to Kafka it is gone, like the later ones.
                    b.errors[k] = os_error_text(exc, pd)
                finally:
                    _touch(b.touched, pd)
        except BaseException:
            b.close()
            raise
        return b

    def finish_batch(self, b: StartedBatch) -> list[tuple[int, str | None, bool]]:
        """Make a started batch durable: one fsync per partition dir it touched — or, on a
        filesystem that commits its journal in order (ext4, XFS: ``fsjournal``), one fsync
        of the dir changed last, which commits them all; ``(freed, error, untouched)`` per
        segment. Closes the batch's dirs."""
        try:
            # The dir changed last first: on a filesystem that commits in order, its fsync
            # makes every earlier change on that filesystem durable (``fsjournal``).
            committed: set[int] = set()
            for pd in reversed(list(b.touched)):
                dfd = b.fds[pd]
                dev = os.fstat(dfd).st_dev
                if dev in committed:
                    continue
                self.step("fsync-unlinked")
                try:
                    os.fsync(dfd)
                except OSError as exc:
                    for k, sub in enumerate(b.subs):
                        if sub["partition_dir"] == pd and b.errors[k] is None:
                            b.errors[k] = f"{exc.strerror or exc} ({pd})"
                    continue
                if self.commits_in_order(dev):
                    committed.add(dev)
        finally:
            b.close()
        return list(zip(b.freed, b.errors, b.untouched, strict=True))

    def rename_all(self, dfd: int, names: Sequence[str], renamed: list[tuple[str, bool]]) -> int:
        """Rename a segment's files (``.log`` first) to ``.deleted``; the bytes they hold.

        If one cannot be renamed (an immutable ``.index``: ``EPERM``), the ones renamed
        before it are renamed back (``SegmentRestored``): else the ``.log`` would be gone
        and its indexes left behind, and Kafka's log loading, which deletes such orphaned
        index files, fails on the one that cannot be removed: the broker that the rescue
        was for would not start (measured on Kafka 2.2)."""
        freed = 0
        first = len(renamed)
        for name in names:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # never ours (checked before; a race must not make it ours)
            self.step(f"rename:{name}")
            try:
                os.rename(name, name + DELETED_SUFFIX, src_dir_fd=dfd, dst_dir_fd=dfd)
                renamed.append((name, False))
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    if self._restore(dfd, names, renamed, first):
                        raise SegmentRestored(exc.errno, exc.strerror, exc.filename) from exc
                    raise
                # A longer name may need a new directory block on a full disk: the journal
                # already names the file, so unlinking it directly is just as recoverable.
                os.unlink(name, dir_fd=dfd)
                renamed.append((name, True))
            freed += unlink_frees(st)
        return freed

    def _restore(
        self, dfd: int, names: Sequence[str], renamed: list[tuple[str, bool]], first: int
    ) -> bool:
        """Rename back what this call renamed of a segment (``renamed[first:]``, last first);
        True if the segment is whole again: every file back and none of its names left as
        ``.deleted`` (from an earlier, interrupted try). Not if a file was unlinked already
        (the full-disk path) or a rename back fails: then it stays started, for ``recover``."""
        mine = renamed[first:]
        if any(unlinked for _name, unlinked in mine):
            return False
        for name, _unlinked in reversed(mine):
            self.step(f"restore:{name}")
            try:
                os.rename(name + DELETED_SUFFIX, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError:
                return False
            renamed.pop()
        for name in names:
            try:
                os.stat(name + DELETED_SUFFIX, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # as it should be
            except OSError:
                pass  # cannot tell: not whole
            return False
        return True

    def remove(self, partition_dir: str, names: Sequence[str]) -> int:
        """Rename every name to ``.deleted``, fsync, unlink, fsync; the bytes freed."""
        dfd = os.open(partition_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            renamed: list[tuple[str, bool]] = []
            freed = self.rename_all(dfd, names, renamed)
            self.step("fsync-renamed")
            os.fsync(dfd)
            for name, unlinked in renamed:
                if unlinked:
                    continue
                self.step(f"unlink:{name}")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name + DELETED_SUFFIX, dir_fd=dfd)
            self.step("fsync-unlinked")
            os.fsync(dfd)
            return freed
        finally:
            os.close(dfd)

    def remove_recovering(self, partition_dir: str, names: Sequence[str]) -> int:
        """Finish an interrupted ``remove``: rename what is left, unlink every ``.deleted``."""
        freed = self.remove(partition_dir, names)
        dfd = os.open(partition_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            gone, changed = unlink_regular(dfd, [name + DELETED_SUFFIX for name in names])
            freed += gone
            if changed:
                os.fsync(dfd)
        finally:
            os.close(dfd)
        return freed

    def step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)


class StartedBatch:
    """A batch whose files are renamed and unlinked but not fsync'd yet (``start_batch``):
    per segment the bytes freed, the error, whether it was left untouched, whether its error
    will recur (``LASTING_ERRNOS``); the open dirs."""

    def __init__(self, subs: Sequence[Mapping[str, Any]]) -> None:
        self.subs = subs
        self.freed = [0] * len(subs)
        self.errors: list[str | None] = [None] * len(subs)
        self.untouched = [False] * len(subs)
        self.lasting = [False] * len(subs)
        self.fds: dict[str, int] = {}
        self.touched: dict[str, None] = {}  # partition dirs, the one changed last at the end

    def close(self) -> None:
        """Close the batch's dirs (once: ``fds`` is emptied)."""
        fds, self.fds = self.fds, {}
        for dfd in fds.values():
            os.close(dfd)


def _touch(touched: dict[str, None], partition_dir: str) -> None:
    """Move ``partition_dir`` to the end of ``touched`` (insertion order = last change)."""
    touched.pop(partition_dir, None)
    touched[partition_dir] = None


def unlink_regular(dfd: int, names: Sequence[str]) -> tuple[int, bool]:
    """Unlink the regular files among ``names`` in the dir open as ``dfd`` (anything else, or
    a file gone meanwhile, is left alone); the bytes freed, and whether anything went."""
    freed, changed = 0, False
    for name in names:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)
            changed = True
            freed += unlink_frees(st)
    return freed, changed
