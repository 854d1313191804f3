"""inotify hints for the daemon loop (watchdog): what changed under the log dirs, roughly.

Events are *hints*: the kernel queue can overflow and watchdog hides that, so the loop's
usage poll and periodic rescan stay the truth; a hint only wakes the loop early and says
whether a plan's inputs may have changed (``HintSummary``). The same watches time the
broker's reclaim of the segments diskguard asked it to delete (``on_reclaim``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from diskguard.host import inotifywatches
from diskguard.kafkalog import lockfile
from diskguard.logs import get_logger

log = get_logger("diskguard.daemon")

#: ``(kind, src_path, dest_path, monotonic time)``: a segment file renamed (``moved``) or
#: unlinked (``deleted``), for the broker's reclaim latency (``ReclaimWatch.on_event``).
ReclaimEvent = Callable[[str, str, str, float], None]


class _ReclaimEvents(FileSystemEventHandler):
    """inotify renames/unlinks of segments we asked the broker for: the reclaim latency."""

    def __init__(self, on_reclaim: ReclaimEvent) -> None:
        self._on_reclaim = on_reclaim

    def on_moved(self, event: FileSystemEvent) -> None:
        self._on_reclaim("moved", str(event.src_path), str(event.dest_path), time.monotonic())

    def on_deleted(self, event: FileSystemEvent) -> None:
        self._on_reclaim("deleted", str(event.src_path), "", time.monotonic())


#: Only changes: opens, reads and closes without a write are left out of the inotify mask.
#: Our own reads of checkpoints and ``.lock`` produced those, and each woke the loop for
#: another cycle that read them again: a busy loop while stuck over a limit.
_EVENT_FILTER = [
    FileCreatedEvent,
    DirCreatedEvent,
    FileDeletedEvent,
    DirDeletedEvent,
    FileMovedEvent,
    DirMovedEvent,
    FileModifiedEvent,
    FileClosedEvent,
]


@dataclass(frozen=True)
class HintSummary:
    """What the hints since the last iteration said, in the categories a plan cares about.

    ``structural``: a name appeared, went or moved, or a file written to was closed (a roll,
    a deletion, a checkpoint rewritten): the plan's inputs changed. Appends (``modified``, the
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


class _Hint(FileSystemEventHandler):
    """A change under a log dir wakes the loop; what changed is found by rescanning."""

    def __init__(self, wake: Callable[[], None], log_dirs: Iterable[str] = ()) -> None:
        self._wake = wake
        self._log_dirs = frozenset(os.path.normpath(d) for d in log_dirs)
        self._mutex = threading.Lock()
        self._structural = False
        self._partitions = False
        self._locks: set[str] = set()

    def on_any_event(self, event: FileSystemEvent) -> None:
        kind = event.event_type
        if kind in ("opened", "closed_no_write"):
            return  # reads (ours among them) change nothing
        with self._mutex:
            for raw in (event.src_path, getattr(event, "dest_path", "")):
                path = os.fsdecode(raw)
                if not path:
                    continue
                parent = os.path.dirname(path)
                if os.path.basename(path) == lockfile.LOCK_FILE:
                    self._locks.add(parent)
                elif kind != "modified":
                    self._structural = True
                    # A log dir's own file (a checkpoint) is not a partition's change.
                    if event.is_directory or os.path.normpath(parent) not in self._log_dirs:
                        self._partitions = True
        self._wake()

    def take(self) -> HintSummary:
        with self._mutex:
            summary = HintSummary(self._structural, frozenset(self._locks), self._partitions)
            self._structural = False
            self._partitions = False
            self._locks.clear()
        return summary


#: What guards a log dir (or part of one) that inotify does not watch.
_FALLBACK = "usage poll and a full rescan every check_interval (no back-off while stuck)"


def _unwatched(exc: OSError) -> None:
    """No inotify at all (the instance limit reached...): the poll and the rescan still guard."""
    log.warning("watch_failed", error=exc.strerror or str(exc), fallback=_FALLBACK)


def _dirs_of(log_dir: Path) -> list[tuple[str, int]]:
    """The log dir and the dirs directly in it (partitions...), as (path, inode): what a
    recursive watch must cover for a roll or a deletion anywhere to wake the loop. One
    listing, no stat (``d_ino``); symlinks are not followed, as watchdog does not."""
    out = [(str(log_dir), os.stat(log_dir).st_ino)]
    with os.scandir(log_dir) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                out.append((entry.path, entry.inode()))
    return out


class Watcher:
    """The loop's inotify watches over the log dirs; ``take`` what they saw since last asked.
    ``wake``: called on every hint (the loop's wake-up)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._observer: Any = None
        self._hint: _Hint | None = None
        #: Every dir of every log dir has its watch: hints can be trusted to say "nothing
        #: changed", so the stuck back-off may lengthen the rescan period.
        self.complete = False
        #: log dir -> how many dirs it had when last verified complete (skip the re-check
        #: while that count stays the same); log dirs already reported unwatched.
        self._verified: dict[str, int] = {}
        self._said: set[str] = set()

    def start(self, log_dirs: Iterable[Path], on_reclaim: ReclaimEvent) -> None:
        """inotify hints; without them (watch limit, a vanished dir) the poll still guards.
        ``on_reclaim`` hears the renames and unlinks of segment files."""
        self.complete = False
        self._verified.clear()
        self._said.clear()
        try:
            observer = Observer()  # watchdog opens its inotify instance here
        except OSError as exc:
            _unwatched(exc)
            return
        log_dirs = list(log_dirs)
        handler = _Hint(self._wake, [str(d) for d in log_dirs])
        reclaim_events = _ReclaimEvents(on_reclaim)
        for log_dir in log_dirs:
            try:
                try:
                    watch = observer.schedule(
                        handler, str(log_dir), recursive=True, event_filter=_EVENT_FILTER
                    )
                except TypeError:  # a watchdog without event_filter: _Hint drops reads itself
                    watch = observer.schedule(handler, str(log_dir), recursive=True)
                # Same watch (renames and unlinks pass its filter): our segments' reclaim times.
                observer.add_handler_for_watch(reclaim_events, watch)
            except OSError as exc:
                log.warning(
                    "watch_failed", log_dir=str(log_dir), error=str(exc), fallback=_FALLBACK
                )
                self._said.add(str(log_dir))
        observer.daemon = True
        try:
            observer.start()
        except OSError as exc:
            _unwatched(exc)
            return
        self._observer = observer
        self._hint = handler
        self.verify(log_dirs)

    def verify(self, log_dirs: Iterable[Path]) -> None:
        """Ask the kernel which dirs are really watched; say once per log dir when some are
        not (``watch_failed``), and set ``complete``.

        watchdog drops the ENOSPC of each subdirectory past the watch limit, at start and for
        every partition dir created later, so this runs at start and with each snapshot's
        full rescan (re-reading the watch list only when a log dir's dir count changed).
        """
        if self._observer is None:
            return  # no inotify at all: said at start, ``complete`` stays False
        complete = True
        watched: set[int] | None = None
        for log_dir in log_dirs:
            key = str(log_dir)
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
        self.complete = complete

    def stop(self, timeout: float = 2.0) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=max(0.0, timeout))
            self._observer = None
            self._hint = None

    def take(self) -> HintSummary:
        """What the hints said since the last call (nothing when not watching)."""
        return self._hint.take() if self._hint is not None else HintSummary()
