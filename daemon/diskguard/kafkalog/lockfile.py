"""The broker's ``<log_dir>/.lock``: is a broker using this log dir, and keeping it out while
diskguard deletes files itself.

Kafka's ``FileLock`` takes the lock with Java's ``FileChannel.tryLock()``, which OpenJDK on
Linux implements as a POSIX record lock (``fcntl(F_SETLK)``, exclusive, whole file) — the
same kind Python's ``fcntl.lockf`` takes. So:

- ``held_by_other`` asks the kernel with ``F_GETLK`` who would block an exclusive lock. It
  never takes the lock, so a broker starting at that very moment cannot fail because of a
  probe. Locks held by this process never conflict with its own ``F_GETLK``, which is why a
  probe while ``hold`` is active answers False (and never opens a second fd, see below).
- ``hold`` takes the lock non-blocking for the duration of an offline deletion: a broker
  started mid-deletion fails fast with "Failed to acquire lock on file .lock" instead of
  loading a half-deleted dir.

The POSIX-lock trap: closing ANY fd of the locked file in the holding process drops the
lock. While a dir is held, this module never opens or closes its ``.lock`` again (a
process-wide registry of held dirs answers instead), and nothing else in diskguard opens
``.lock`` files.

A missing ``.lock`` means no broker has the dir (Kafka creates the file when it locks it, and
3.x/4.x delete it again at a clean shutdown): ``held_by_other`` answers False without
creating it (probes stay read-only, ``plan`` runs read-only); ``hold`` creates it, as Kafka
would, so a broker starting during the deletion finds it locked, and removes it again when
done. The broker runs as its own user and opens ``.lock`` read-write: a file diskguard (root)
created and left would fail the whole log dir at the broker's next start ("Disk error while
locking directory ... AccessDeniedException", measured on 4.4). So a ``.lock`` that hold
creates, or finds owned by another user than the log dir, is given the log dir's owner first;
a crash between creating and removing it leaves a file the broker can use.

Limits: BSD ``flock`` locks are a separate kind the kernel does not report through
``F_GETLK``; a tool that used ``flock`` on ``.lock`` would go unnoticed (Kafka does not).
Linux only (``struct flock`` layout below).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from diskguard.host import safeopen
from diskguard.kafkalog.model import LockHolder

LOCK_FILE = ".lock"

#: ``struct flock`` on Linux (x86_64 and aarch64): short l_type, short l_whence, off_t l_start,
#: off_t l_len, pid_t l_pid, padded to 32 bytes.
_FLOCK = struct.Struct("hhqqi4x")


class LockHeld(Exception):
    """Another process holds ``<log_dir>/.lock``: a broker (or another tool) is using it."""

    def __init__(self, log_dir: str | os.PathLike[str], pid: int | None = None) -> None:
        self.log_dir = str(log_dir)
        self.pid = pid
        who = f" (pid {pid})" if pid else ""
        super().__init__(f"another process{who} holds {self.log_dir}/{LOCK_FILE}")


_registry_lock = threading.RLock()
#: realpath of a held log dir -> (fd, nesting count, whether hold created the file).
_held: dict[str, tuple[int, int, bool]] = {}


def _key(log_dir: str | os.PathLike[str]) -> str:
    return os.path.realpath(log_dir)


def holder_pid(log_dir: str | os.PathLike[str]) -> int | None:
    """The pid of another process holding ``.lock`` (0 if it lives in another pid namespace
    or could not be probed, -1 for an open-file-description lock), or None when nobody else
    holds it.

    An existing ``.lock`` that cannot be probed (permissions, a symlink, not a regular file)
    counts as held: the answer gates deleting files, so doubt must mean "a broker may be
    running". It is opened non-blocking: a FIFO named ``.lock`` answers "held" at once
    instead of blocking the probe forever (see ``unprobeable``).
    """
    key = _key(log_dir)
    # The whole probe runs under the registry lock: a ``hold`` taken by another thread between
    # our open and close would otherwise be dropped by our close.
    with _registry_lock:
        if key in _held:
            # We hold it; opening another fd and closing it would release our own lock.
            return None
        return _probe(key)


def _probe(key: str) -> int | None:
    path = os.path.join(key, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        return 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0  # a FIFO, device...: no broker lock we can see; doubt means held
        query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError:
        return 0
    finally:
        os.close(fd)
    l_type, _whence, _start, _len, pid = _FLOCK.unpack(answer)
    if l_type == fcntl.F_UNLCK:
        return None
    return int(pid)


def unprobeable(log_dir: str | os.PathLike[str]) -> str | None:
    """Why ``<log_dir>/.lock`` cannot be probed (then it counts as held), or None.

    For a warning beside a refusal: "another process holds it" would send the operator
    looking for a broker when the problem is the file itself."""
    path = os.path.join(os.fspath(log_dir), LOCK_FILE)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot be probed ({exc.strerror or exc}); treated as held by a broker"
    if not stat.S_ISREG(mode):
        return (
            f"{path}: not a regular file ({safeopen.what_is(mode)}); cannot tell whether a "
            "broker holds it, treated as held"
        )
    return None


def holder(log_dir: str | os.PathLike[str]) -> LockHolder | None:
    """Who else holds ``<log_dir>/.lock`` (None: nobody), for a refusal to name: "is the
    broker running?" sent operators looking for a broker when the holder was another
    diskguard mid-deletion."""
    pid = holder_pid(log_dir)
    if pid is None:
        return None
    problem = unprobeable(log_dir)
    if problem is not None:
        return LockHolder(pid, "unknown", f"nothing that can be named ({problem})")
    return describe_pid(pid)


def describe_pid(pid: int) -> LockHolder:
    """What ``/proc/PID/cmdline`` says about the lock holder ``pid`` (``holder_pid``'s
    answer: 0 and -1 name no process)."""
    if pid == 0:
        return LockHolder(
            pid, "unknown", "a process in another PID namespace (a broker in a container?)"
        )
    if pid < 0:
        return LockHolder(pid, "unknown", "an open-file-description lock (no pid reported)")
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [os.fsdecode(a) for a in fh.read().split(b"\0") if a]
    except OSError:
        argv = []
    for i, arg in enumerate(argv):
        tail = argv[i + 1 :]
        if os.path.basename(arg) == "diskguard" or (arg == "-m" and tail[:1] == ["diskguard"]):
            words = tail[1:] if arg == "-m" else tail
            return LockHolder(
                pid, "diskguard", f"another diskguard (pid {pid}: {_shown(['diskguard', *words])})"
            )
    if any(a in ("kafka.Kafka", "kafka.docker.KafkaDockerWrapper") for a in argv):
        return LockHolder(pid, "broker", f"a Kafka broker (pid {pid})")
    if not argv:
        return LockHolder(pid, "other", f"pid {pid} (its command line cannot be read)")
    return LockHolder(pid, "other", f"pid {pid} ({_shown([os.path.basename(argv[0]), *argv[1:]])})")


def _shown(argv: list[str], limit: int = 80) -> str:
    """A command line in one short line (a ``-c`` program's newlines folded)."""
    text = " ".join(" ".join(argv).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def held_by_other(log_dir: str | os.PathLike[str]) -> bool:
    """True when another process holds ``<log_dir>/.lock`` (a broker is using the dir)."""
    return holder_pid(log_dir) is not None


def held_by_us(log_dir: str | os.PathLike[str]) -> bool:
    """True inside ``hold(log_dir)`` in this process."""
    with _registry_lock:
        return _key(log_dir) in _held


@contextmanager
def hold(log_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``<log_dir>/.lock`` exclusively for the body; raise ``LockHeld`` if another process
    has it. Re-entrant within this process (a nested ``hold`` of the same dir is a no-op)."""
    key = _key(log_dir)
    # Every open/close of a ``.lock`` in this process happens under the registry lock, so no
    # thread's close can drop another thread's hold (POSIX locks belong to the process).
    with _registry_lock:
        if key in _held:
            fd, depth, created = _held[key]
            _held[key] = (fd, depth + 1, created)
        else:
            fd, created = _acquire(key)
            _held[key] = (fd, 1, created)
    try:
        yield
    finally:
        with _registry_lock:
            fd, depth, created = _held[key]
            if depth > 1:
                _held[key] = (fd, depth - 1, created)
            else:
                del _held[key]
                if created:
                    # As Kafka's clean shutdown leaves it: no file. Unlinked while still
                    # locked, so a broker starting now makes its own.
                    with suppress(OSError):
                        os.unlink(os.path.join(key, LOCK_FILE))
                os.close(fd)  # closing the only fd releases the lock


def _acquire(key: str) -> tuple[int, bool]:
    """The locked fd of ``<key>/.lock``, and whether this call created the file."""
    path = os.path.join(key, LOCK_FILE)
    flags = os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    created = False
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        created = True
    except FileExistsError:
        fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):
        # Never "hold" something that is not the broker's lock file: refuse as if held.
        os.close(fd)
        raise LockHeld(key, 0)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            raise LockHeld(key, _probe(key)) from None
        raise
    _give_to_dir_owner(fd, info, key)
    return fd, created


def _give_to_dir_owner(fd: int, info: os.stat_result, key: str) -> None:
    """The lock file owned by the log dir's owner (the broker's user), as the broker made it.

    Only root can give a file away; anyone else created it as themselves and the broker,
    if it runs as another user, could not have started on that dir anyway."""
    try:
        owner = os.stat(key)
        if (info.st_uid, info.st_gid) != (owner.st_uid, owner.st_gid):
            os.fchown(fd, owner.st_uid, owner.st_gid)
    except OSError:
        pass


def lock_path(log_dir: str | os.PathLike[str]) -> Path:
    return Path(log_dir) / LOCK_FILE
