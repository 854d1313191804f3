"""What an offline sweep may remove from a log dir, and how much that frees: the targets
(``-delete`` dirs; ``*.deleted`` leftovers in live partition dirs) and their sizes, walked
through dir fds, never following a symlink, never into another filesystem.

Its own module, apart from ``sweep`` (which journals, audits and removes), so that ``plan``
can preview the sweep (``preview_sweep``) without loading the journal and executors.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import replace

from diskguard.kafkalog.kraftmeta import METADATA_DIR
from diskguard.kafkalog.listing import ListingCache
from diskguard.kafkalog.model import PartitionDirKind, parse_partition_dir
from diskguard.kafkalog.scan import ScanResult
from diskguard.retention.offline.guards import Refused, is_deleted_leftover, unlink_frees


def preview_sweep(result: ScanResult, listings: ListingCache | None = None) -> ScanResult:
    """``result`` with what the offline sweep would free counted as pending reclaim in each
    log dir, and what it would refuse as a warning: ``plan`` in offline mode, as the cycle it
    previews sweeps before it plans (else the plan chooses live segments the sweep spares)."""
    problems: list[str] = []
    filesystems = []
    for fs in result.filesystems:
        dirs = []
        for d in fs.log_dirs:
            freed, refused = (0, []) if d.error else sweepable_bytes(d.path, listings)
            problems.extend(refused)
            dirs.append(replace(d, pending_reclaim_bytes=d.pending_reclaim_bytes + freed))
        filesystems.append(replace(fs, log_dirs=tuple(dirs)))
    return replace(result, filesystems=tuple(filesystems), warnings=(*result.warnings, *problems))


def sweepable_bytes(log_dir: str, listings: ListingCache | None = None) -> tuple[int, list[str]]:
    """What an offline sweep of ``log_dir`` would free now, and what of it it would refuse.

    ``plan`` in offline mode counts these bytes as pending reclaim: the cycle it previews
    sweeps before it plans, so without them the plan chose live segments the sweep makes
    unnecessary. The same targets, sizes and refusals as ``Sweeper.sweep``; read only (no
    ``.lock``, no journal, no audit)."""
    real = os.path.realpath(log_dir)
    try:
        delete_dirs, partitions = targets(real, listings)
    except OSError as exc:
        return 0, [f"{log_dir}: cannot list it to preview the offline sweep: {exc.strerror or exc}"]
    total, problems = 0, []
    for part in delete_dirs:
        try:
            total += tree_size(real, part.name)[0]
        except Refused as exc:
            problems.append(f"{part.path}: the offline sweep will refuse it: {exc}")
        except OSError as exc:
            problems.append(f"{part.path}: the offline sweep cannot size it: {exc.strerror or exc}")
    for part in partitions:
        try:
            total += leftovers(part.path)[1]
        except OSError as exc:
            problems.append(f"{part.path}: the offline sweep cannot list it: {exc.strerror or exc}")
    return total, problems


def targets(
    real: str, listings: ListingCache | None
) -> tuple[list[os.DirEntry[str]], list[os.DirEntry[str]]]:
    """The sweep's targets in the log dir ``real``: its ``-delete`` dirs, and the live
    partition dirs that may hold ``*.deleted`` leftovers.

    Only -delete dirs: a -future dir is a replica move between log dirs in progress (its data
    is the partition's future), and a KRaft broker keeps -stray dirs for an operator to
    decide about (it never deletes them). ``__cluster_metadata-0`` is never swept: the
    metadata log is the broker's (and the controller's) own, removed only by it."""
    with os.scandir(real) as it:
        entries = sorted(it, key=lambda e: e.name)
    partitions = [
        part
        for part in _dirs(entries, PartitionDirKind.LIVE)
        if part.name != METADATA_DIR and _may_hold_deleted(listings, part.path)
    ]
    return _dirs(entries, PartitionDirKind.DELETE), partitions


def _may_hold_deleted(listings: ListingCache | None, path: str) -> bool:
    """False only when the (re-validated) listing shows no ``*.deleted`` name: sweeping
    every partition dir before every offline cycle listed 300k names at 100k segments."""
    if listings is None:
        return True
    try:
        return listings.listing(path, full=False, hand_on=True).deleted_files > 0
    except OSError:
        return True  # let the sweep itself meet (and report) the problem


def leftovers(path: str) -> tuple[list[str], int]:
    """The ``*.deleted`` leftovers of one partition dir (regular files only, sorted) and the
    bytes removing them frees (a file with another hard link frees nothing)."""
    names: list[str] = []
    nbytes = 0
    with os.scandir(path) as entries:
        for entry in entries:
            name = entry.name
            if not is_deleted_leftover(name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            names.append(name)
            nbytes += unlink_frees(st)
    names.sort()
    return names, nbytes


def _dirs(entries: Iterable[os.DirEntry[str]], kind: PartitionDirKind) -> list[os.DirEntry[str]]:
    """The directories (never a symlink) among ``entries`` named as partition dirs of ``kind``."""
    return [
        e
        for e in entries
        if (parsed := parse_partition_dir(e.name)) is not None
        and parsed.kind is kind
        and e.is_dir(follow_symlinks=False)
    ]


def tree_size(log_dir_real: str, name: str) -> tuple[int, int]:
    """Allocated bytes and file count of dir ``name`` in the log dir, never following a
    symlink; Refused if it is not a directory or anything below it is on another device (a
    mount point inside a ``-delete`` dir is never ours to empty)."""
    dfd = os.open(log_dir_real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dev = os.fstat(dfd).st_dev
        return walk_below(dfd, name, dev)
    finally:
        os.close(dfd)


def open_dir_at(parent_fd: int, name: str, dev: int) -> int:
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd
        )
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(f"{name} is not a directory (symlink?)") from None
        raise
    if os.fstat(fd).st_dev != dev:
        os.close(fd)
        raise Refused(f"{name} is on another filesystem (a mount point); not swept")
    return fd


def walk_below(parent_fd: int, name: str, dev: int, remove: bool = False) -> tuple[int, int]:
    """Bytes (``unlink_frees``) and count of the files below dir ``name``, never following a
    symlink, Refused at another device; with ``remove``, each file is unlinked and each dir
    removed on the way back up, and only what went is counted. One walk for both, so the
    sweep's preview in ``plan`` and the sweep itself count alike."""
    fd = open_dir_at(parent_fd, name, dev)
    try:
        nbytes, nfiles = 0, 0
        with os.scandir(fd) as it:
            children = sorted(e.name for e in it)
        for child in children:
            try:
                st = os.stat(child, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                b, n = walk_below(fd, child, dev, remove)
                nbytes, nfiles = nbytes + b, nfiles + n
                if remove:
                    with contextlib.suppress(FileNotFoundError):
                        os.rmdir(child, dir_fd=fd)
                continue
            if remove:
                try:
                    os.unlink(child, dir_fd=fd)
                except FileNotFoundError:
                    continue
            nbytes, nfiles = nbytes + unlink_frees(st), nfiles + 1
        return nbytes, nfiles
    finally:
        os.close(fd)
