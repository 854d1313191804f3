"""inotify hints for the daemon loop: what changed under the log dirs, roughly.

Size: over 400 lines: the reader (its thread, its watches, what each event means) and the
watcher (whether those watches still cover every dir: ``complete``) fail together, and each
way the reader can lose a dir is what the watcher must answer for.

Events are *hints*: the loop's usage poll and periodic rescan stay the truth; a hint only
wakes the loop early and says whether a plan's inputs may have changed (``HintSummary``). The
same watches time the broker's reclaim of the segments diskguard asked it to delete
(``on_reclaim``).

One thread reads the inotify descriptor (``inotify_simple``, a thin ctypes wrapper over the
system calls): a read takes every queued event at once, and after each read the thread
waits ``_BATCH_S`` so that a broker's stream of appends arrives in batches. Why not
watchdog, used before: three threads per observer, several Python objects and a queue
hand-off per event, and a delay queue pairing renames; beside a writer at 60 MiB/s they took
twice the CPU of the retention cycle itself, and competed with it for the interpreter lock
on a crossing's path. An event-queue overflow (``IN_Q_OVERFLOW``), which watchdog hid, is
now known: the hint then says everything may have changed.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from inotify_simple import INotify
from inotify_simple import flags as _flags

from diskguard.host import inotifywatches
from diskguard.kafkalog import lockfile
from diskguard.logs import get_logger

log = get_logger("diskguard.daemon")

#: ``(kind, src_path, dest_path, monotonic time)``: a segment file renamed (``moved``) or
#: unlinked (``deleted``), for the broker's reclaim latency (``ReclaimWatch.on_event``).
ReclaimEvent = Callable[[str, str, str, float], None]

_CREATE = int(_flags.CREATE)
_DELETE = int(_flags.DELETE)
_MOVED_FROM = int(_flags.MOVED_FROM)
_MOVED_TO = int(_flags.MOVED_TO)
_MODIFY = int(_flags.MODIFY)
_CLOSE_WRITE = int(_flags.CLOSE_WRITE)
_SELF = int(_flags.DELETE_SELF) | int(_flags.MOVE_SELF)
_ISDIR = int(_flags.ISDIR)
_IGNORED = int(_flags.IGNORED)
_UNMOUNT = int(_flags.UNMOUNT)
_OVERFLOW = int(_flags.Q_OVERFLOW)
_DONT_FOLLOW = int(_flags.DONT_FOLLOW)
#: Only changes: opens, reads and closes without a write are left out. Our own reads of
#: checkpoints and ``.lock`` produced those, and each woke the loop for another cycle that
#: read them again: a busy loop while stuck over a limit.
_MASK = (
    _CREATE
    | _DELETE
    | _MOVED_FROM
    | _MOVED_TO
    | _MODIFY
    | _CLOSE_WRITE
    | _SELF
    | _DONT_FOLLOW
    | int(_flags.ONLYDIR)
)
#: After a read, the thread waits this long before the next (seconds): a stream of appends
#: (one ``IN_MODIFY`` each) costs at most 1 / _BATCH_S reads a second, and an event is
#: still seen well within the loop's own pace (``schedule.HINT_PACE_S``).
_BATCH_S = 0.005
#: ``IN_MOVED_FROM`` halves waiting for their ``IN_MOVED_TO`` (same cookie), at most this
#: many: a rename out of the watched tree never gets one.
_PAIRS_MAX = 4096
#: A partition's leader epochs, rewritten (a temporary file renamed over) whenever its
#: leadership changes: for every partition as a broker starts, or as leaders move in a
#: cluster. No plan reads it: like an append, it names the dir and changes nothing else.
_EPOCH_CHECKPOINTS = frozenset({"leader-epoch-checkpoint", "leader-epoch-checkpoint.tmp"})


@dataclass(frozen=True)
class HintSummary:
    """What the hints since the last iteration said, in the categories a plan cares about.

    ``structural``: a name appeared, went or moved, or a file written to was closed (a roll,
    a deletion, a checkpoint rewritten): the plan's inputs changed. A partition's
    ``leader-epoch-checkpoint`` is not among them (no plan reads it). Appends (``modified``, the
    active segment growing) still wake the loop but change only sizes, which usage shows.
    ``partitions``: a structural change in a partition dir or of one (a dir made, removed or
    renamed in a log dir), rather than a log dir's own files (its checkpoints, which a
    broker rewrites every few seconds whether or not anything changed).
    ``lock_dirs``: dirs whose ``.lock`` had an event; whether that matters is for a probe to
    say, because diskguard's own offline sweep opens ``.lock`` for writing too.
    """

    structural: bool = False
    lock_dirs: frozenset[str] = frozenset()
    partitions: bool = False


class _Hint:
    """What the events since the last ``take`` said (the reader thread adds, the loop takes)."""

    def __init__(self, log_dirs: Iterable[str]) -> None:
        self.log_dirs = frozenset(os.path.normpath(d) for d in log_dirs)
        self.mutex = threading.Lock()
        self.structural = False
        self.partitions = False
        self.locks: set[str] = set()
        #: The names of the dirs in a log dir (partition dirs) that had any event, appends
        #: included, since ``take_touched`` last asked; None: any dir may have changed (the
        #: start, lost events).
        self.touched: set[str] | None = None

    def everything(self) -> None:
        """Events were lost (queue overflow): any of it may have changed."""
        with self.mutex:
            self.structural = self.partitions = True
            self.locks.update(self.log_dirs)
            self.touched = None

    def take_touched(self) -> frozenset[str] | None:
        """The touched dirs' names since the last call (None: any), and start afresh."""
        with self.mutex:
            touched, self.touched = self.touched, set()
        return None if touched is None else frozenset(touched)

    def take(self) -> HintSummary:
        with self.mutex:
            summary = HintSummary(self.structural, frozenset(self.locks), self.partitions)
            self.structural = False
            self.partitions = False
            self.locks.clear()
        return summary


class _Reader:
    """The watches of one inotify instance over the log dirs and the dirs directly in them
    (each made later too; ``watch_tree``), and the thread that reads them: hints into
    ``hint``, renames and unlinks to ``on_reclaim``, ``wake`` after each batch that had any
    event."""

    def __init__(
        self,
        inotify: INotify,
        hint: _Hint,
        wake: Callable[[], None],
        on_reclaim: ReclaimEvent,
    ) -> None:
        self._inotify = inotify
        self._hint = hint
        self._wake = wake
        self._on_reclaim = on_reclaim
        #: watch descriptor -> the dir's path (kept up to date when a watched dir is renamed)
        self._paths: dict[int, str] = {}
        self._moved_from: dict[int, str] = {}
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="diskguard-inotify", daemon=True)
        #: A log dir's own watch went (the dir removed, moved away, its filesystem
        #: unmounted), or this thread stopped reading: no hint no longer means no change
        #: (``Watcher.complete``). Nothing watches a log dir anew until a reload.
        self.lost = False
        #: Dirs that could not be watched when met (the watch limit...), so far: ``verify``
        #: asks the kernel again whenever this grew, even if no dir count changed.
        self.failed_adds = 0
        #: ``_done``: the thread has ended; ``_abandoned``: ``stop`` gave up waiting for it,
        #: so it closes the descriptors on its way out (under ``_closing``: exactly once).
        self._closing = threading.Lock()
        self._done = False
        self._abandoned = False
        #: A batch of appends only (``IN_MODIFY``) and of the log dirs' own files (the
        #: broker's checkpoints) is recorded but wakes nobody (the loop's usage poll sees
        #: their bytes): set by the loop while quiet (``Watcher.lazy``).
        self.lazy_appends = False

    def watch_tree(self, top: str) -> None:
        """Watch the log dir ``top`` and every dir in it (partitions, ``-delete`` dirs; no
        symlink followed): a roll, a deletion, a partition made or removed is an event of
        one of them. ``top`` failing raises; a dir in it failing (the watch limit, gone
        meanwhile) is skipped: the kernel's own list says what is watched
        (``Watcher.verify``). Dirs deeper down (a tiered partition's
        ``remote_log_snapshot``) hold nothing a plan reads, and finding them listed every
        file of every partition dir (3M names at a million segments), at start and again
        after a queue overflow, on the reader's thread."""
        # The log dir as the scan takes it, through a symlink if it is one (a log dir under
        # /var/lib/kafka linked to a data disk); nothing below it is followed.
        self._paths[self._inotify.add_watch(top, _MASK & ~_DONT_FOLLOW)] = top
        self._watch_in(top)

    def _add(self, path: str) -> bool:
        """Watch one dir below a log dir; False if it is gone meanwhile or cannot be watched
        (counted in ``failed_adds``)."""
        try:
            self._paths[self._inotify.add_watch(path, _MASK)] = path
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError:
            self.failed_adds += 1
            return False
        return True

    def _watch_in(self, top: str) -> None:
        try:
            with os.scandir(top) as entries:
                dirs = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for path in dirs:
            self._add(path)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=max(0.0, timeout))
        with self._closing:
            if not self._done:
                self._abandoned = True  # still busy (a long walk): it closes when it ends
                return
        self.close()

    def close(self) -> None:
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)
        self._inotify.close()

    def _run(self) -> None:
        try:
            self._read_until_stopped()
        except Exception as exc:  # a bug here must not silence the hints unsaid
            log.warning("watch_failed", error=repr(exc), fallback=_FALLBACK)
        finally:
            self.lost = True
            with self._closing:
                self._done = True
                abandoned = self._abandoned
            if abandoned:
                self.close()

    def _read_until_stopped(self) -> None:
        poller = select.poll()
        poller.register(self._inotify.fileno(), select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ev in poller.poll()}
            if self._stop_r in ready:
                return
            try:
                events = self._inotify.read(timeout=0)
            except OSError as exc:
                log.warning("watch_failed", error=exc.strerror or str(exc), fallback=_FALLBACK)
                return
            if events and (self._handle(events) or not self.lazy_appends):
                self._wake()
            time.sleep(_BATCH_S)

    def _handle(self, events: Iterable[tuple[int, int, int, str]]) -> bool:
        """Take a batch of events into the hint; True if it held more than appends and the
        log dirs' own files (lost events, ``.lock`` and partition dirs' changes: the loop is
        woken even while quiet). A broker rewrites its checkpoints in the log dir every few
        seconds (``replication-offset-checkpoint`` every 5 s: five events each), changed or
        not; while quiet they only woke the loop to poll usage early, which its own poll
        does within a second."""
        now = time.monotonic()
        hint = self._hint
        structural = partitions = lost = False
        locks: set[str] = set()
        touched: set[str] = set()
        reclaim: list[tuple[str, str, str]] = []
        for wd, mask, cookie, name in events:
            if mask & _OVERFLOW:
                self._overflowed()
                lost = True  # what was lost may be a roll or a deletion: never lazy
                continue
            parent = self._paths.get(wd)
            if mask & _UNMOUNT or (mask & (_IGNORED | _SELF) and parent in hint.log_dirs):
                structural = partitions = True
                self._lose(parent)
            if mask & _IGNORED:
                self._paths.pop(wd, None)
                continue
            if parent is None:
                continue
            # The partition dir's name, for whatever happened in it or to it (a snapshot
            # while quiet re-reads only these dirs' sizes).
            touched.add(name if parent in hint.log_dirs else os.path.basename(parent))
            if mask & _SELF:
                structural = partitions = True
                continue
            if name == lockfile.LOCK_FILE:
                locks.add(parent)
                continue
            if mask == _MODIFY:
                continue  # an append: a size, which usage shows
            if name in _EPOCH_CHECKPOINTS and parent not in hint.log_dirs:
                continue
            structural = True
            is_dir = bool(mask & _ISDIR)
            if is_dir or parent not in hint.log_dirs:
                partitions = True  # a log dir's own file (a checkpoint) is not a partition's
            path = f"{parent}/{name}"
            if mask & _MOVED_FROM:
                if len(self._moved_from) >= _PAIRS_MAX:
                    self._moved_from.clear()
                self._moved_from[cookie] = path
            elif mask & _MOVED_TO:
                src = self._moved_from.pop(cookie, None)
                if src is not None:
                    reclaim.append(("moved", src, path))
                if is_dir:
                    self._renamed_dir(src, parent, path)
            elif mask & _DELETE:
                reclaim.append(("deleted", path, ""))
            elif mask & _CREATE and is_dir:
                self._new_dir(parent, path)
        if structural or locks or touched:
            with hint.mutex:
                hint.structural = hint.structural or structural
                hint.partitions = hint.partitions or partitions
                hint.locks.update(locks)
                if hint.touched is not None:
                    hint.touched.update(touched)
        for kind, src, dest in reclaim:
            self._on_reclaim(kind, src, dest, now)
        return partitions or lost or bool(locks)

    def _new_dir(self, parent: str, path: str) -> None:
        """A dir made in a log dir (a new partition): watched too (its files made before the
        watch came send no event; the scan sees them). Past the watch limit ``verify`` says
        so."""
        if parent in self._hint.log_dirs:
            self._add(path)

    def _renamed_dir(self, src: str | None, parent: str, dest: str) -> None:
        """A watched dir keeps its watch when renamed (same inode): its events now come under
        ``dest``; one moved in from elsewhere is watched anew, and so is one renamed before
        its watch came (made and renamed at once: the watch of its first name found none).
        Only a log dir's own dirs are watched (``watch_tree``): nothing below them to walk."""
        watched = False
        if src is not None:
            for wd, path in list(self._paths.items()):
                if path == src:
                    self._paths[wd] = dest
                    watched = True
        if not watched:
            self._new_dir(parent, dest)

    def _lose(self, path: str | None) -> None:
        """A log dir's watch went, or the filesystem of ``path`` was unmounted: said once."""
        if not self.lost:
            log.warning(
                "watch_failed",
                log_dir=path,
                error="a log dir was removed, moved away or unmounted: no longer watched",
                fallback=_FALLBACK,
            )
        self.lost = True

    def _overflowed(self) -> None:
        """The kernel dropped events: everything may have changed, and a dir made meanwhile
        may not be watched yet (adding a watch twice is harmless). A log dir's own watch may
        have gone with the lost events: added again, and if that fails, it is lost."""
        self._hint.everything()
        for top in sorted(self._hint.log_dirs):
            try:
                self.watch_tree(top)
            except OSError:
                self._lose(top)


#: What guards a log dir (or part of one) that inotify does not watch.
_FALLBACK = "usage poll and a full rescan every check_interval (no back-off while stuck)"


def _unwatched(exc: OSError) -> None:
    """No inotify at all (the instance limit reached...): the poll and the rescan still guard."""
    log.warning("watch_failed", error=exc.strerror or str(exc), fallback=_FALLBACK)


def _dirs_of(log_dir: Path) -> list[tuple[str, int]]:
    """The log dir and the dirs directly in it (partitions...), as (path, inode): what a
    watch must cover for a roll or a deletion anywhere to wake the loop. One
    listing, no stat (``d_ino``); symlinks are not followed."""
    out = [(str(log_dir), os.stat(log_dir).st_ino)]
    with os.scandir(log_dir) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                out.append((entry.path, entry.inode()))
    return out


def _dir_count(entries: Sequence[os.DirEntry[str]] | None) -> int | None:
    """The log dir and the dirs in ``entries`` (as ``_dirs_of`` counts them); None if unknown."""
    if entries is None:
        return None
    try:
        return 1 + sum(1 for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return None  # a type the listing did not give, and the entry gone since


class Watcher:
    """The loop's inotify watches over the log dirs; ``take`` what they saw since last asked.
    ``wake``: called on every hint (the loop's wake-up)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._reader: _Reader | None = None
        self._hint: _Hint | None = None
        #: Every dir of every log dir had its watch when last verified (``complete``).
        self._complete = False
        #: log dir -> how many dirs it had when last verified complete (skip the re-check
        #: while that count stays the same); log dirs already reported unwatched.
        self._verified: dict[str, int] = {}
        self._said: set[str] = set()
        #: The reader's ``failed_adds`` when ``verify`` last asked the kernel.
        self._failed_seen = 0

    @property
    def complete(self) -> bool:
        """Every dir of every log dir has its watch and the reader reads them: hints can be
        trusted to say "nothing changed", so the stuck back-off may lengthen the rescan
        period."""
        reader = self._reader
        return (
            self._complete
            and reader is not None
            and not reader.lost
            and reader.failed_adds == self._failed_seen
        )

    def start(self, log_dirs: Iterable[Path], on_reclaim: ReclaimEvent) -> None:
        """inotify hints; without them (watch limit, a vanished dir) the poll still guards.
        ``on_reclaim`` hears the renames and unlinks of segment files."""
        self._complete = False
        self._verified.clear()
        self._said.clear()
        self._failed_seen = 0
        try:
            inotify = INotify()
        except OSError as exc:
            _unwatched(exc)
            return
        log_dirs = list(log_dirs)
        hint = _Hint(str(d) for d in log_dirs)
        try:
            reader = _Reader(inotify, hint, self._wake, on_reclaim)
        except OSError as exc:  # no descriptor left for its stop pipe
            inotify.close()
            _unwatched(exc)
            return
        for log_dir in log_dirs:
            try:
                reader.watch_tree(os.path.normpath(str(log_dir)))
            except OSError as exc:
                log.warning(
                    "watch_failed", log_dir=str(log_dir), error=str(exc), fallback=_FALLBACK
                )
                self._said.add(str(log_dir))
        try:
            reader.start()
        except RuntimeError as exc:  # no thread could be started
            reader.close()
            log.warning("watch_failed", error=str(exc), fallback=_FALLBACK)
            return
        self._reader = reader
        self._hint = hint
        self.verify(log_dirs)

    def verify(
        self,
        log_dirs: Iterable[Path],
        listed: Callable[[str], Sequence[os.DirEntry[str]] | None] | None = None,
    ) -> None:
        """Ask the kernel which dirs are really watched; say once per log dir when some are
        not (``watch_failed``), and set ``complete``.

        A dir past the watch limit cannot be watched (``ENOSPC``), at start or when made
        later, so this runs at start and with each snapshot's full rescan (re-reading the
        watch list only when a log dir's dir count changed). ``listed``: the log dir's
        entries as that rescan listed them a moment ago (None: not listed), which give the
        count without listing 9,000 dirs again; a dir made since is either watched or
        counted as failed (then every count is checked afresh), and only a count that
        changed lists the log dir again and asks the kernel.
        """
        if self._reader is None:
            return  # no inotify at all: said at start, ``complete`` stays False
        failed = self._reader.failed_adds
        if failed != self._failed_seen:
            self._verified.clear()  # a dir met since could not be watched: ask again
            self._failed_seen = failed
        complete = True
        watched: set[int] | None = None
        for log_dir in log_dirs:
            key = str(log_dir)
            known = self._verified.get(key)
            if known is not None and listed is not None and _dir_count(listed(key)) == known:
                continue
            try:
                dirs = _dirs_of(log_dir)
                if self._verified.get(key) == len(dirs):
                    continue
                if watched is None:
                    watched = inotifywatches.watched_inodes()
            except OSError:
                complete = False  # a vanished log dir: the scan says so; no hints from it
                continue
            missing = [path for path, ino in dirs if ino not in watched]
            if not missing:
                self._verified[key] = len(dirs)
                self._said.discard(key)
                continue
            self._verified.pop(key, None)
            complete = False
            if key in self._said:
                continue
            self._said.add(key)
            limit = inotifywatches.max_user_watches()
            log.warning(
                "watch_failed",
                log_dir=key,
                error=(
                    f"inotify watch limit reached: {len(missing)} of {len(dirs)} dirs not "
                    f"watched (fs.inotify.max_user_watches = {limit}, shared by every "
                    "inotify user of this uid; raise it)"
                ),
                fallback=_FALLBACK,
                unwatched_dirs=len(missing),
                first_unwatched=missing[0],
            )
        if complete and not self._complete and self._hint is not None:
            # Complete again: what the unwatched dirs went through was never heard.
            with self._hint.mutex:
                self._hint.touched = None
        self._complete = complete

    def stop(self, timeout: float = 2.0) -> None:
        if self._reader is not None:
            self._reader.stop(timeout)
            self._reader = None
            self._hint = None

    def take(self) -> HintSummary:
        """What the hints said since the last call (nothing when not watching)."""
        return self._hint.take() if self._hint is not None else HintSummary()

    @property
    def lazy(self) -> bool:
        """Appends and the log dirs' own files (checkpoints) alone wake nobody (the loop
        while quiet: its usage poll sees their bytes)."""
        return self._reader is not None and self._reader.lazy_appends

    @lazy.setter
    def lazy(self, value: bool) -> None:
        if self._reader is not None:
            self._reader.lazy_appends = value

    def take_touched(self) -> frozenset[str] | None:
        """The names of the partition dirs that had any event (an append included) since the
        last call, and start afresh: every other dir is as the last scan left it, as far as
        the hints can tell. None when they cannot tell: not ``complete`` now, events lost,
        or the first call."""
        hint = self._hint
        if hint is None:
            return None
        touched = hint.take_touched()
        return touched if self.complete else None
