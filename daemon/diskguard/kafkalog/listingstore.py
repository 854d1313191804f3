"""Names-only partition listings kept between one-shot plans, in the state dir (edge).

Why: a warm ``plan`` of a large log dir spent a third of its CPU listing ~300 names in each
partition dir, though a closed segment's dir changes only when the broker rolls, deletes,
renames or cleans in it. A dir's ``st_ctime_ns`` changes with every entry made, removed or
renamed in it (and with any ``utime``, so a restored ``mtime`` cannot bring an old listing
back), and no process can set it: the same ``(st_dev, st_ino, st_mtime_ns, st_ctime_ns)`` as
when it was listed means the same names, the rule ``ListingCache`` keeps listings by
within one process, with ``ctime`` added for the time between two. So a plan keeps what it
listed (:func:`save`) and the next one takes a dir's listing from there (:meth:`ListingStore.get`)
where one ``stat`` of the dir shows it unchanged, and lists every other dir as before.

What is kept: only a listing of names (never a full one, whose sizes change without the dir
changing), only of a dir without ``*.deleted`` files (their sizes are part of the listing),
and only where the dir had not changed for ``SETTLE_S`` when it was ``stat``ed before the
listing: a change in the same clock tick as that ``stat`` could leave its ``ctime`` as it
was; nor where its times are whole seconds (a clock set back could bring them again). A
store that cannot be read, is not exactly this format, or another user made, is no store:
each dir is listed.

Format (``STORE_NAME`` in ``daemon.state_dir``): ``MAGIC``, the CRC-32 of the rest in hex
and a newline, a JSON header line (one
``[path, st_dev, st_ino, st_mtime_ns, st_ctime_ns, flags, bases]`` per dir, ``bases`` a
count), then every dir's base offsets as native 8-byte integers, in the header's order.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import time
import zlib
from array import array
from collections.abc import Iterable, Mapping
from pathlib import Path

from diskguard.host import processes, safeopen
from diskguard.kafkalog.listing import PartitionListing

__all__ = [
    "SETTLE_S",
    "STORE_NAME",
    "ListingStore",
    "Stamp",
    "load",
    "save",
    "stamp",
    "storable",
]

STORE_NAME = "partition-listings.bin"
MAGIC = b"diskguard partition listings 1\n"
#: As ``ListingCache``'s ``settle_s``: a dir changed within this many seconds of its ``stat``
#: is not kept.
SETTLE_S = 2.0
#: A store larger than this is not read (1M segments' bases are ~8 MB).
MAX_STORE_BYTES = 256 * 1024 * 1024
#: A dir's identity and state: ``(st_dev, st_ino, st_mtime_ns, st_ctime_ns)``.
Stamp = tuple[int, int, int, int]

_REMOTE, _TXN, _METADATA = 1, 2, 4
_SECOND_NS = 1_000_000_000
_MAX_BASE = (1 << 63) - 1
#: Nothing is kept on a filesystem with less free than this (a store of 1M segments' bases
#: is ~9 MB).
MIN_FREE_BYTES = 256 * 1024 * 1024
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def stamp(st: os.stat_result, now: float | None = None) -> Stamp | None:
    """The stamp a listing made after ``st`` (the dir's ``stat``) may be kept under, or None
    where the dir changed within ``SETTLE_S`` of ``now`` (default: now)."""
    when = time.time() if now is None else now
    if when - st.st_ctime_ns / 1e9 <= SETTLE_S or when - st.st_mtime_ns / 1e9 <= SETTLE_S:
        return None
    if st.st_ctime_ns % _SECOND_NS == 0 and st.st_mtime_ns % _SECOND_NS == 0:
        # Whole seconds: a filesystem keeping its times in seconds (ext4 with 128-byte
        # inodes, ext3). There, once the clock is set back, a change in the very second
        # the dir was kept at leaves both times as they were; with nanoseconds it cannot.
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def storable(listing: PartitionListing) -> bool:
    """May ``listing`` be kept? Names only, no ``*.deleted`` file (whose bytes it holds), and
    every base an 8-byte integer (a stray ``99999999999999999999.log`` is not one)."""
    if listing.full or listing.deleted_files or listing.linked:
        return False
    return not listing.bases or listing.bases[-1] <= _MAX_BASE  # sorted: the last is the most


class ListingStore:
    """The listings a plan kept, by partition dir path."""

    def __init__(self, entries: Mapping[str, tuple[Stamp, PartitionListing]]) -> None:
        self._entries = dict(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, path: str, st: os.stat_result) -> PartitionListing | None:
        """``path``'s kept listing where ``st`` (its ``stat`` now) shows the dir unchanged."""
        kept = self._entries.get(path)
        if kept is None:
            return None
        (dev, ino, mtime_ns, ctime_ns), listing = kept
        if (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns) != (dev, ino, mtime_ns, ctime_ns):
            return None
        if mtime_ns % _SECOND_NS == 0 and ctime_ns % _SECOND_NS == 0:
            return None  # never kept now (``stamp``): a store from before that rule
        return listing


def load(state_dir: str | os.PathLike[str]) -> ListingStore:
    """The store in ``state_dir``; an empty one where there is none, or it cannot be read or
    is not exactly this format, or another user made it (one who may write in the state
    dir, a plan's only, could otherwise choose what a root plan sees of a dir)."""
    try:
        fd, st = safeopen.open_regular_stat(os.path.join(state_dir, STORE_NAME))
        with os.fdopen(fd, "rb") as file:
            if st.st_uid != os.geteuid():
                return ListingStore({})
            data = file.read(MAX_STORE_BYTES + 1)
        if len(data) > MAX_STORE_BYTES:
            return ListingStore({})
        return ListingStore(_parse(data))
    except (OSError, ValueError, TypeError, OverflowError):
        return ListingStore({})


def _parse(data: bytes) -> dict[str, tuple[Stamp, PartitionListing]]:
    if not data.startswith(MAGIC):
        raise ValueError("not a listing store")
    body = memoryview(data)[len(MAGIC) + 9 :]
    if data[len(MAGIC) : len(MAGIC) + 9] != b"%08x\n" % zlib.crc32(body):
        raise ValueError("not a listing store")  # torn or damaged
    end = data.index(b"\n", len(MAGIC) + 9)
    header = json.loads(data[len(MAGIC) + 9 : end])
    bases = array("q")
    if bases.itemsize != 8:
        raise ValueError("no 8-byte integers here")
    bases.frombytes(data[end + 1 :])  # ValueError unless whole integers
    if not isinstance(header, list):
        raise ValueError("not a listing store")
    out: dict[str, tuple[Stamp, PartitionListing]] = {}
    at = 0
    for path, dev, ino, mtime_ns, ctime_ns, flags, count in header:
        numbers = (dev, ino, mtime_ns, ctime_ns, flags, count)
        if not isinstance(path, str) or not all(type(n) is int for n in numbers) or count < 0:
            raise ValueError("not a listing store")
        mine = tuple(bases[at : at + count])
        at += count
        if len(mine) != count or not all(map(operator.lt, mine, mine[1:])):  # increasing
            raise ValueError("not a listing store")
        listing = PartitionListing(
            mine,
            0,
            0,
            (),
            False,
            (),
            bool(flags & _REMOTE),
            0,
            bool(flags & _TXN),
            bool(flags & _METADATA),
        )
        out[path] = ((dev, ino, mtime_ns, ctime_ns), listing)
    if at != len(bases):
        raise ValueError("not a listing store")
    return out


def save(
    state_dir: str | os.PathLike[str], entries: Iterable[tuple[str, Stamp, PartitionListing]]
) -> None:
    """Keep ``entries`` (each storable: see :func:`storable`) in ``state_dir``, replacing what
    was kept there; nothing where ``state_dir`` is not there or not writable (a plan run by
    someone else than the daemon's user), or its filesystem has less than ``MIN_FREE_BYTES``
    free."""
    # A name of this process's own: two plans at once never write into one file. Made anew
    # (``O_EXCL``): what is there under that name (a killed plan's, or a hard link to some
    # other file planted there) is unlinked, never written through, and a name made again
    # meanwhile leaves nothing kept. Opened first: where the state dir is not there (a first
    # plan on a host without a daemon), nothing is built.
    tmp = Path(state_dir) / f".{STORE_NAME}.{os.getpid()}.tmp"
    try:
        fs = os.statvfs(state_dir)
        # An optimisation never takes the space the daemon's journal and audit log need.
        if fs.f_bavail * fs.f_frsize < MIN_FREE_BYTES:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, _WRITE_FLAGS, 0o600)
    except OSError:
        return
    try:
        try:
            header = []
            bases = array("q")
            for path, (dev, ino, mtime_ns, ctime_ns), listing in entries:
                flags = (
                    (_REMOTE if listing.remote_log_state else 0)
                    | (_TXN if listing.txn_indexes else 0)
                    | (_METADATA if listing.partition_metadata else 0)
                )
                header.append([path, dev, ino, mtime_ns, ctime_ns, flags, len(listing.bases)])
                bases.extend(listing.bases)
            body = json.dumps(header, separators=(",", ":")).encode() + b"\n" + bases.tobytes()
            view = memoryview(MAGIC + b"%08x\n" % zlib.crc32(body) + body)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, Path(state_dir) / STORE_NAME)
    except (OSError, OverflowError):  # Overflow: a base past 8 bytes, never ``storable``
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return
    _remove_orphans(state_dir)


def _remove_orphans(state_dir: str | os.PathLike[str]) -> None:
    """Unlink the temp files of plans that were killed while saving (``SIGKILL``, OOM):
    up to ~9 MB each, one per pid, that nothing else would ever remove. Only this module's
    own temp names, and only of a pid no process has now (a live one may be saving)."""
    prefix, suffix = f".{STORE_NAME}.", ".tmp"
    try:
        with os.scandir(state_dir) as entries:
            names = [e.name for e in entries if e.name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) : -len(suffix)] if name.endswith(suffix) else ""
        if not pid.isascii() or not pid.isdigit() or pid != str(int(pid)):
            continue
        if int(pid) > processes.PID_MAX_LIMIT:
            continue  # no process has that id: not a name a plan made
        if not processes.running(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(Path(state_dir) / name)
