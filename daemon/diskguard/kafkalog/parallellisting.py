"""Listing many partition dirs on two cores: every other one in a forked child (edge).

Why: listing 1,000 partition dirs of 300 files each is ~0.16 s of a one-shot ``plan``, half of it
Python per name, on one core of a machine that has more (a cold plan should take no longer than
``du`` of the same tree). The child lists every other dir (interleaved, so neither half is all of
one big topic) while this process lists the rest; each listing is the same ``list_partition`` with
the same ``stat`` key ``ListingCache`` keeps it under. What fails for one dir (vanished,
unreadable) is kept as that dir's ``OSError`` and raised where the scan asks for it, as if
it had been listed there and then.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

from diskguard.host.forked import ForkedStream, can_fork
from diskguard.kafkalog.listing import LinkedFile, PartitionListing, list_partition

__all__ = ["MIN_DIRS", "Listed", "list_in_parallel"]

#: Below this many dirs to list, a fork costs more than it saves.
MIN_DIRS = 256
#: A dir's ``(inode, mtime_ns)`` when it was listed, and its listing or why there is none.
Listed = tuple[tuple[int, int], PartitionListing] | OSError


def list_in_parallel(paths: Sequence[str], full: bool, force: bool = False) -> dict[str, Listed]:
    """Every path's listing (and stat key), or its error; {} when not worth a fork or not
    safe (other threads), unless ``force`` (tests). The caller lists those itself then."""
    if not force and (len(paths) < MIN_DIRS or not can_fork()):
        return {}
    theirs = paths[1::2]
    try:
        stream = ForkedStream(lambda: (_listed_plain(p, full) for p in theirs))
    except OSError:
        return {}  # no fork today (EAGAIN, ENOMEM): one core does it all
    with contextlib.closing(stream):
        out = {p: _listed(p, full) for p in paths[0::2]}
        for path, item in zip(theirs, stream, strict=True):
            out[path] = _from_plain(item)
    return out


def _listed(path: str, full: bool) -> Listed:
    try:
        st = os.stat(path, follow_symlinks=False)
        return (st.st_ino, st.st_mtime_ns), list_partition(path, full)
    except OSError as exc:
        return exc


def _listed_plain(path: str, full: bool) -> tuple[Any, ...]:
    """``_listed`` as plain data for ``marshal`` (the child's side)."""
    got = _listed(path, full)
    if isinstance(got, OSError):
        return (False, got.errno, got.strerror, got.filename)
    key, lst = got
    linked = tuple((x.name, x.dev, x.ino, x.nlink, x.bytes, x.deleted) for x in lst.linked)
    return (
        True,
        key,
        (
            lst.bases,
            lst.deleted_bytes,
            lst.settled_bytes,
            lst.active_files,
            lst.full,
            linked,
            lst.remote_log_state,
            lst.deleted_files,
            lst.txn_indexes,
            lst.partition_metadata,
        ),
    )


def _from_plain(item: tuple[Any, ...]) -> Listed:
    if not item[0]:
        _ok, code, strerror, filename = item
        return OSError(code, strerror, filename)  # FileNotFoundError for ENOENT, and so on
    _ok, key, (bases, deleted, settled, active, full, linked, remote, n_deleted, txn, pmeta) = item
    return tuple(key), PartitionListing(
        bases,
        deleted,
        settled,
        active,
        full,
        tuple(LinkedFile(*x) for x in linked),
        remote,
        n_deleted,
        txn,
        pmeta,
    )
