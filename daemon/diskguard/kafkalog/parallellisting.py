"""Listing many partition dirs on two cores: a forked worker and this process meet (edge).

Why: listing 1,000 partition dirs of 300 files each is ~0.16 s of a one-shot ``plan``, half of it
Python per name, on one core of a machine that has more (a plan should take no longer than ``du``
of the same tree). The worker (``host.forked.Worker``) lists the dirs from the first on while this
process lists them from the last back, until the two meet (``host.forked.Claims``): the worker
starts early (before the plan's imports, or its broker round trips) and this process's share is
what is left when it comes to it, however long that took. Each listing is the same
``list_partition`` with the same ``stat`` key ``ListingCache`` keeps it under. What fails for one
dir (vanished, unreadable) is kept as that dir's ``OSError`` and raised where the scan asks for
it, as if it had been listed there and then.

The worker's share may be asked for early (``start``: before the plan's broker round trips, which
it then overlaps) and taken later (``EarlyListing.take``), with this process's share listed then.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from diskguard.host.forked import ChildFailed, Claims, Worker, WorkStream, meanwhile
from diskguard.kafkalog.listing import LinkedFile, PartitionListing, list_partition
from diskguard.kafkalog.listingstore import ListingStore, Stamp, stamp, storable

__all__ = ["MIN_DIRS", "EarlyListing", "Listed", "list_in_parallel", "use_store"]

#: Below this many dirs to list, sending them to the worker costs more than it saves.
MIN_DIRS = 256
#: A dir's ``(inode, mtime_ns)`` when it was listed, and its listing or why there is none.
Listed = tuple[tuple[int, int], PartitionListing] | OSError
#: What a plan may keep of a dir's listing for the next (``listingstore``): the stamp it was
#: listed under (None: not to be kept), and whether it was listed now (not taken from there).
Kept = tuple[Stamp | None, bool]

#: The listings this process may take instead of listing a dir (``use_store``).
_STORE: ListingStore | None = None


def use_store(store: ListingStore | None) -> None:
    """From now on a dir unchanged since ``store`` kept its listing is not listed again."""
    global _STORE
    _STORE = store


def list_in_parallel(
    paths: Sequence[str], full: bool, worker: Worker | None, force: bool = False
) -> dict[str, Listed]:
    """Every path's listing (and stat key), or its error; {} without a worker or when not
    worth it, unless ``force`` (tests). The caller lists those itself then."""
    early = EarlyListing.start(paths, full, worker, force)
    return {} if early is None else early.take(paths)


class EarlyListing:
    """The worker lists ``paths`` from the first on from now on; ``take`` lists them from the
    last back here until the two meet, and gathers the worker's."""

    #: While listing its share, this process takes what the worker sent every this many dirs
    #: (a worker whose pipe is full waits: a million segments' bases fill it in ~200 dirs).
    DRAIN_EVERY = 16

    def __init__(self, paths: Sequence[str], full: bool, stream: WorkStream) -> None:
        self.full = full
        self._paths = list(paths)
        self._stream: WorkStream | None = stream
        #: Once taken: the dirs the worker listed (and holds the listings of).
        self.listed_by_worker: frozenset[str] = frozenset()
        #: Once taken: what the next plan may take of these listings (``to_keep``).
        self._kept: dict[str, tuple[Stamp, PartitionListing]] = {}
        self._fresh = False

    @classmethod
    def start(
        cls,
        paths: Sequence[str],
        full: bool,
        worker: Worker | None,
        force: bool = False,
        then: tuple[str, str] | None = None,
    ) -> EarlyListing | None:
        """``then``: (module, function) the worker calls with what it listed, as
        ``listed_plain`` says."""
        if worker is None or (not force and len(paths) < MIN_DIRS):
            return None
        try:
            return cls(
                paths,
                full,
                worker.stream(listed_plain, list(paths), full, then, claims=len(paths)),
            )
        except ChildFailed:
            return None  # the worker is gone: one core does it all

    def close(self) -> None:
        """Not taken after all: the worker stops (its listings are of no use)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def take(self, paths: Sequence[str]) -> dict[str, Listed]:
        """The listings of ``paths``: this process lists from the last of the worker's list
        back until it meets the worker, then takes the worker's (every one it listed, whether
        in ``paths`` or not); a path the worker was not given is listed here. {} if taken
        before. A worker that failed on its share costs nothing but the time: the scan lists
        those of its dirs it did not send."""
        stream, self._stream = self._stream, None
        if stream is None:
            return {}
        early = self._paths
        wanted = set(paths)
        claims = stream.claims
        assert claims is not None
        out: dict[str, Listed] = {}
        drain_at = len(early) - self.DRAIN_EVERY
        for j in range(len(early) - 1, -1, -1):
            if not claims.back(j):
                break
            if early[j] in wanted:
                out[early[j]] = self._note(early[j], *_listed(early[j], self.full))
            if j <= drain_at:
                stream.drain()
                drain_at = j - self.DRAIN_EVERY
        theirs = []
        with contextlib.closing(stream):
            try:
                for path, item in zip(early, stream, strict=False):
                    theirs.append(path)
                    if path not in out:  # where the two met, both may have listed it
                        out[path] = self._note(path, *_from_plain(item))
            except ChildFailed:
                pass  # the rest are listed one by one where the scan asks for them
        self.listed_by_worker = frozenset(theirs)
        given = set(early)
        for path in paths:
            if path not in given:
                out[path] = self._note(path, *_listed(path, self.full))
        return out

    def _note(self, path: str, got: Listed, kept: Kept) -> Listed:
        """``got``, noting what of it the next plan may take (``to_keep``)."""
        at, fresh = kept
        self._fresh = self._fresh or fresh
        if at is not None and not isinstance(got, OSError):
            self._kept[path] = (at, got[1])
        return got

    def to_keep(self) -> list[tuple[str, Stamp, PartitionListing]] | None:
        """Once taken: the listings the next plan may take (``listingstore.save``), or None
        where every one was taken from the store already (it holds them as they are)."""
        if not self._fresh:
            return None
        return [(path, at, listing) for path, (at, listing) in self._kept.items()]


def listed_plain(
    paths: list[str], full: bool, then: tuple[str, str] | None, claims: Claims
) -> Iterator[tuple[Any, ...]]:
    """The worker's side: ``paths`` from the first on, each ``_listed`` as plain data for
    ``marshal``, until this process has taken the next (``Claims``). ``then``: a function
    (module, name) called with the ``(path, PartitionListing)`` of each dir listed here; what
    it returns is stepped through while the worker waits for its next request
    (``forked.meanwhile``)."""
    listed: list[tuple[str, PartitionListing]] = []
    for i, path in enumerate(paths):
        if not claims.front(i):
            break
        got, kept = _listed(path, full)
        if not isinstance(got, OSError):
            listed.append((path, got[1]))
        yield _plain(got, kept)
    if then is not None:
        meanwhile(_then(then, listed))


def _then(then: tuple[str, str], listed: list[tuple[str, PartitionListing]]) -> Iterator[Any]:
    """``then``'s work, its module imported at the first step: once the listing's end is
    sent, not before (the planner's modules took ~17 ms, which this process waited for)."""
    module, name = then
    yield from getattr(importlib.import_module(module), name)(listed)


def _listed(path: str, full: bool) -> tuple[Listed, Kept]:
    """``path``'s listing (from the store where its dir is unchanged since it was kept)."""
    try:
        now = time.time()  # before the ``stat``: see ``listingstore.stamp``
        st = os.stat(path, follow_symlinks=False)
        key = (st.st_ino, st.st_mtime_ns)
        if _STORE is not None and not full and (kept := _STORE.get(path, st)) is not None:
            return (key, kept), ((st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns), False)
        listing = list_partition(path, full)
        return (key, listing), (stamp(st, now) if storable(listing) else None, True)
    except OSError as exc:
        return exc, (None, True)


def _plain(got: Listed, kept: Kept) -> tuple[Any, ...]:
    """``_listed``'s result as plain data for ``marshal`` (the child's side)."""
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
        kept,
    )


def _from_plain(item: tuple[Any, ...]) -> tuple[Listed, Kept]:
    if not item[0]:
        _ok, code, strerror, filename = item
        # FileNotFoundError for ENOENT, and so on
        return OSError(code, strerror, filename), (None, True)
    _ok, key, fields, (at, fresh) = item
    bases, deleted, settled, active, full, linked, remote, n_deleted, txn, pmeta = fields
    listing = PartitionListing(
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
    return (tuple(key), listing), (None if at is None else tuple(at), fresh)
