"""Space diskguard unlinked that the filesystem has not given back (edge).

An offline deletion is done when its files are gone, but its space is freed only when the
filesystem says so: btrfs at its next commit, XFS after background inode inactivation, never
while a snapshot or a reflinked copy shares the extents or another process holds the file
open. A cycle that trusted ``statvfs`` right after its unlinks reported "still over" and
deleted again, cycle after cycle (plain btrfs: every closed segment for an excess of 2.5).

So after its unlinks an offline cycle waits for the space (``await_freed``): at once if
``statvfs`` already shows it (ext4, tmpfs), else after ``syncfs`` and at most
``FREE_WAIT_S``. Until then those bytes are pending reclaim, and the cycle's ``usage_after``
and exit code are measured after the wait. What has not come back by then, where something
says why (a process holding the files open, a filesystem that can share extents or free
late), is recorded here (``Unfreed``): the retention on that filesystem stops, with one
event naming the cause, rather than delete more for nothing, until the space comes back
(``came_back``: the usage fell by those bytes, or nobody holds the files any more). The
record lives in ``<state_dir>/unfreed.json`` so that a later ``enforce --once`` (a cron or
``until`` loop) knows it too and does not walk the history one run at a time.
"""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from diskguard.config import Config
from diskguard.configschema import Problem, build
from diskguard.host import freespace, fsusage
from diskguard.host.atomicfile import read_json, write_json_atomic
from diskguard.kafkalog.model import DELETED_SUFFIX, FilesystemUsage
from diskguard.logs import get_logger
from diskguard.retention.waittrace import WaitTrace

if TYPE_CHECKING:
    from diskguard.host.openfiles import OpenDeletedFile
    from diskguard.retention.ceilings import Ceilings
    from diskguard.retention.forecaster import Forecaster
    from diskguard.retention.planner import DeletionResult, Plan

log = get_logger("diskguard.retention")

UNFREED_FILE = "unfreed.json"
UNFREED_VERSION = 1
#: The longest a cycle waits for its unlinks to show as free space (after ``syncfs``).
FREE_WAIT_S = 2.0
_POLL_S = 0.02
#: Shortfalls below this are noise (a directory block, another writer's few pages).
_MIN_TOLERANCE = 256 * 1024
#: At most this many of the unlinked paths are kept (the held-open re-check's names).
_MAX_PATHS = 512


@dataclass(frozen=True)
class Unfreed:
    """Bytes diskguard unlinked on one filesystem that have not come back, and why."""

    mount: str
    device: str
    #: Bytes missing after the wait.
    bytes: int
    #: ``used_bytes`` measured at the end of the wait: the space has come back once usage
    #: falls by ``bytes`` from here.
    used_bytes: int
    #: Wall-clock seconds of the cycle that found it.
    since: float
    #: Why, in a few words for the operator (named in every event while it lasts).
    cause: str
    #: True when processes were found holding the unlinked files open.
    held_open: bool = False
    #: The unlinked files' last names (``*.deleted``), for the held-open re-check.
    paths: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        """The sentence every event and the plan give while the retention stays stopped."""
        return (
            f"{self.bytes} bytes of segments diskguard deleted on {self.mount} did not free "
            f"their space: {self.cause}; no more segments are deleted there until it comes "
            f"back (or {UNFREED_FILE} in the state dir is removed)"
        )


@dataclass(frozen=True)
class _UnfreedFile:
    filesystems: dict[str, Unfreed] = field(default_factory=dict)
    version: int = UNFREED_VERSION


#: The last ``unfreed_state_unreadable`` said (path, error): read every offline cycle, a bad
#: file is said once, not once a cycle.
_said_unreadable: tuple[str, str] | None = None


def load(state_dir: Path) -> dict[str, Unfreed]:
    """mount -> what a cycle recorded (empty when there is no file, or it cannot be read: a
    warning says so once; then the next cycle can only find it again)."""
    global _said_unreadable
    path = Path(state_dir) / UNFREED_FILE
    error = ""
    found: _UnfreedFile | None = None
    try:
        raw = read_json(path, None)
        if raw is None:
            return {}
        problems: list[Problem] = []
        found = build(_UnfreedFile, raw, (), problems) if isinstance(raw, dict) else None
    except (OSError, ValueError, TypeError) as exc:
        error = str(exc)
    if found is not None and found.version == UNFREED_VERSION:
        return dict(found.filesystems)
    said = (str(path), error or "not a file of this shape")
    if said != _said_unreadable:
        _said_unreadable = said
        log.warning("unfreed_state_unreadable", path=said[0], error=said[1])
    return {}


def save(state_dir: Path, records: Mapping[str, Unfreed], make_room: Callable[[], bool]) -> None:
    """Write (or remove, when empty) ``<state_dir>/unfreed.json``, crash-safely. The disk it
    is on may be the full one: ENOSPC gives back a chunk of the audit reserve and retries."""
    path = Path(state_dir) / UNFREED_FILE
    try:
        if not records:
            path.unlink(missing_ok=True)
            return
        value = asdict(_UnfreedFile(dict(records)))
        while True:
            try:
                write_json_atomic(path, value)
                return
            except OSError as exc:
                if exc.errno == errno.ENOSPC and make_room():
                    continue
                raise
    except OSError as exc:
        log.warning("unfreed_state_write_failed", path=str(path), error=exc.strerror or str(exc))


def unlinked_paths(files: Iterable[str]) -> list[str]:
    """The names a deleted segment's files had when they were unlinked (renamed first)."""
    return [f"{f}{DELETED_SUFFIX}" for f in files][:_MAX_PATHS]


def _holders(log_dir: str, paths: Iterable[str]) -> list[OpenDeletedFile]:
    """The processes holding ``paths`` open after their unlink (read only when deletions
    did not give their space back: ``plan`` need not load the /proc scanner)."""
    from diskguard.host import openfiles

    wanted = set(paths)
    try:
        scan = openfiles.scan_deleted_open_files([log_dir])
    except OSError:
        return []
    return [f for f in scan.files if f.path in wanted]


def _held_text(holders: list[OpenDeletedFile]) -> str:
    by_pid: dict[int, str] = {}
    for f in holders:
        by_pid.setdefault(f.pid, f.comm)
    named = ", ".join(f"pid {pid} ({comm})" for pid, comm in sorted(by_pid.items())[:3])
    more = f" and {len(by_pid) - 3} more" if len(by_pid) > 3 else ""
    return (
        f"the files are still held open by {named}{more}; their space comes back when it "
        "closes them"
    )


def await_freed(
    log_dir: str,
    before: FilesystemUsage,
    expected: int,
    paths: list[str],
    growth_bytes_per_s: float = 0.0,
    started: float | None = None,
) -> tuple[FilesystemUsage | None, Unfreed | None]:
    """Wait until ``expected`` bytes unlinked on ``log_dir``'s filesystem show as freed.

    ``before``: its usage just before the unlinks (at monotonic time ``started``);
    ``growth_bytes_per_s``: how fast others write to it (their growth is not a shortfall).
    Returns the usage at the end (None if it cannot be measured) and, when part of the space
    did not come back and something says why, the ``Unfreed`` record: processes holding the
    files open, or, where the filesystem can share extents or free late, less than half of it
    back beyond what others' writing during the wait can explain. On ext4 or tmpfs an unlink
    frees at once: a shortfall nobody holds open is others' growth, never recorded.
    """
    t0 = time.monotonic() if started is None else started
    tolerance = max(_MIN_TOLERANCE, expected // 16)

    def measure() -> tuple[FilesystemUsage | None, int]:
        try:
            usage = fsusage.usage_of(log_dir, before.mount, before.device)
        except OSError:
            return None, 0
        grown = int(growth_bytes_per_s * (time.monotonic() - t0))
        return usage, before.used_bytes + grown - usage.used_bytes

    usage, shown = measure()
    if usage is None or expected <= 0 or shown >= expected - tolerance:
        return usage, None
    #: What others' writing can explain beyond their rate (one of their steps).
    slack = 0
    at_once = freespace.frees_at_once(log_dir)
    if not at_once:
        # btrfs, XFS, ZFS...: commit now, then wait (bounded) for the space to show. Never on
        # ext4: its unlinks free at once, and a syncfs there would wait for every writer's
        # dirty data while the disk fills.
        wait_began = time.monotonic()
        trace = WaitTrace.starting(usage.used_bytes)
        with contextlib.suppress(OSError):  # then only the wait
            freespace.syncfs(log_dir)
        deadline = time.monotonic() + FREE_WAIT_S
        paced = False  # the first poll spans the syncfs
        while True:
            usage, shown = measure()
            if usage is None or shown >= expected - tolerance:
                return usage, None
            trace.add(usage.used_bytes, paced)
            paced = True
            if time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        # Others writing meanwhile explain a shortfall as well as a snapshot does: their
        # growth, told apart from the frees, is not evidence of it.
        shown = max(
            shown,
            trace.shown(
                before.used_bytes,
                wait_began - t0,
                time.monotonic() - wait_began,
                growth_bytes_per_s,
            ),
        )
        slack = trace.largest_rise
        if shown + slack >= expected - tolerance:
            return usage, None
    missing = expected - max(0, shown)
    holders = _holders(log_dir, paths)
    if holders:
        from diskguard.host.openfiles import bytes_by_device

        held = sum(bytes_by_device(holders).values())
        cause, missing, held_open = _held_text(holders), min(missing, held), True
    elif at_once or shown + slack >= expected // 2:
        # An unlink here frees at once, or most of it came back (within what others' writing
        # can explain): the shortfall is others' growth or the filesystem's own accounting,
        # no reason to stop anything.
        return usage, None
    else:
        cause = (
            "extents shared with a snapshot or reflinked copies (btrfs, XFS, ZFS), or a "
            f"filesystem that did not free them within {FREE_WAIT_S:g} s of a syncfs"
        )
        held_open = False
    return usage, Unfreed(
        mount=before.mount,
        device=before.device,
        bytes=missing,
        used_bytes=usage.used_bytes,
        since=time.time(),
        cause=cause,
        held_open=held_open,
        paths=paths[:_MAX_PATHS],
    )


def came_back(record: Unfreed, log_dir: str, usage: FilesystemUsage) -> bool:
    """Has the space ``record`` missed come back (the snapshot or the copies removed, the
    files closed), or is this another filesystem now?"""
    if usage.device != record.device:
        return True
    tolerance = max(_MIN_TOLERANCE, record.bytes // 16)
    if usage.used_bytes <= record.used_bytes - record.bytes + tolerance:
        return True
    return bool(record.held_open and record.paths and not _holders(log_dir, record.paths))


class UnfreedSpace:
    """A cycle's side of it: before an offline scan, ``recheck`` what earlier deletions did
    not give back; after offline deletions, ``settle`` (wait for their space, record what
    did not come). ``Ceilings`` holds the current records (``set_unfreed``): the planner
    halts those filesystems through it."""

    def __init__(self, config: Config, ceilings: Ceilings, make_room: Callable[[], bool]) -> None:
        self._state_dir = Path(config.daemon.state_dir)
        self._log_dirs = [str(d) for d in config.broker.log_dirs]
        self._ceilings = ceilings
        self._make_room = make_room
        #: Log dirs on filesystems that show unlinks late (btrfs, XFS...): found at first use.
        self._late: list[str] | None = None

    def _log_dir_on(self, mount: str) -> str | None:
        for group in fsusage.group_by_device(self._log_dirs):
            if group.mount == mount:
                return group.paths[0]
        return None

    def recheck(self, may_delete: Callable[[], bool]) -> None:
        """What earlier deletions did not free (this process's, or an earlier ``enforce
        --once`` run's, from the state dir) either came back now (the retention goes on
        there) or still stops it. Then, where a filesystem shows unlinks late and space may
        be needed, ``syncfs``: the scan measures what the sweep just removed (and what others
        deleted), not the last commit."""
        records = load(self._state_dir)
        kept: dict[str, Unfreed] = {}
        for mount, record in records.items():
            log_dir = self._log_dir_on(mount)
            if log_dir is None:
                continue  # not guarded any more
            try:
                usage = fsusage.usage_of(log_dir, mount, record.device)
            except OSError:
                kept[mount] = record
                continue
            if not came_back(record, log_dir, usage):
                kept[mount] = record
                continue
            log.info(
                "unfreed_space_returned",
                mount=mount,
                bytes=record.bytes,
                cause=record.cause,
                after_s=round(time.time() - record.since, 1),
            )
        if kept != records:
            save(self._state_dir, kept, self._make_room)
        self._ceilings.set_unfreed(kept)
        if self._late is None:
            self._late = [d for d in self._log_dirs if not freespace.frees_at_once(d)]
        if self._late and may_delete():
            for late in self._late:
                with contextlib.suppress(OSError):  # then the scan measures what it can
                    freespace.syncfs(late)

    def before(self, chosen: Plan) -> tuple[dict[str, FilesystemUsage | None], float]:
        """Each planned filesystem's usage just before its deletions, and when."""
        usages = {
            fs.mount: fsusage.usage_of_any(fs.log_dirs, fs.mount, fs.device)
            for fs in chosen.filesystems
        }
        return usages, time.monotonic()

    def settle(
        self,
        chosen: Plan,
        results: Iterable[DeletionResult],
        before: tuple[Mapping[str, FilesystemUsage | None], float],
        forecaster: Forecaster,
    ) -> tuple[dict[str, FilesystemUsage | None], Plan]:
        """After offline deletions: each filesystem's usage once it shows them freed
        (``await_freed``; ``before``: ``before``'s answer; the growth others add, from the
        ``forecaster``'s rates, is not counted as a shortfall), and the
        plan with each filesystem where part did not come back (and something says why)
        ``halted``: recorded (state dir, ``Ceilings``), the retention there stops, and
        ``retention_target_unreachable`` says why (the plan is unreachable: exit code 1)."""
        expected: dict[str, int] = {}
        paths: dict[str, list[str]] = {}
        for res in results:
            if res.ok and res.freed_bytes > 0:
                mount = res.deletion.mount
                expected[mount] = expected.get(mount, 0) + res.freed_bytes
                paths.setdefault(mount, []).extend(unlinked_paths(res.deletion.files))
        measured: dict[str, FilesystemUsage | None] = {}
        stopped: dict[str, Unfreed] = {}
        usages, unlinked_at = before
        for fs in chosen.filesystems:
            usage_before = usages.get(fs.mount)
            if fs.mount not in expected or usage_before is None:
                measured[fs.mount] = fsusage.usage_of_any(fs.log_dirs, fs.mount, fs.device)
                continue
            measured[fs.mount], record = await_freed(
                fs.log_dirs[0],
                usage_before,
                expected[fs.mount],
                paths[fs.mount],
                forecaster.growth_rate(fs.mount) or 0.0,
                unlinked_at,
            )
            if record is not None:
                stopped[fs.mount] = record
        if not stopped:
            return measured, chosen
        records = {**self._ceilings.all_unfreed(), **stopped}
        save(self._state_dir, records, self._make_room)
        self._ceilings.set_unfreed(records)
        filesystems = [
            replace(
                fs,
                halted=stopped[fs.mount].reason,
                unreachable_bytes=max(fs.unreachable_bytes, stopped[fs.mount].bytes, 1),
            )
            if fs.mount in stopped
            else fs
            for fs in chosen.filesystems
        ]
        return measured, replace(chosen, filesystems=tuple(filesystems))
