"""What would stop a configured program or state dir from working, found at load time.

``check-config`` (and every command loading the config) reports these with the schema's
problems, so a hook that cannot start or an unwritable state dir is seen before the disk
fills, not when it has. Each check only looks (stat, access): it changes nothing.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def _shown(text: str) -> str:
    """A path or name as it may appear in a one-line message (quoted if it has control chars)."""
    if text.isprintable():
        return text
    import json  # rare: not worth its import at every start-up

    return json.dumps(text)


def _cannot_check(path: str, exc: OSError | ValueError) -> str:
    """A stat that failed for another reason than absence (EACCES on a parent, ELOOP...)."""
    return f"cannot check {_shown(path)}: {getattr(exc, 'strerror', None) or exc}"


def executable_problem(path: str) -> str | None:
    """What stops ``execve(path)``, or None."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return f"{_shown(path)} does not exist"
    except (OSError, ValueError) as exc:
        return _cannot_check(path, exc)
    if stat.S_ISDIR(st.st_mode):
        return f"{_shown(path)} is a directory, not a program"
    if not stat.S_ISREG(st.st_mode):
        return f"{_shown(path)} is not a regular file"
    if not os.access(path, os.X_OK):
        return f"{_shown(path)} is not executable"
    return None


def program_problem(program: str) -> str | None:
    """What would stop the ``on_change`` hook from starting, found now rather than at the first
    overfull (when the disk is already full). Resolved as ``subprocess``/execvp resolve argv[0]:
    a name with a slash is a path (relative to the working directory), any other name is
    searched in PATH."""
    if not program:
        return "the program name is empty"
    if "\0" in program:
        return f"{_shown(program)} contains a NUL byte"
    if "/" in program:
        return executable_problem(program)
    search = os.get_exec_path()
    unusable: str | None = None
    for directory in search:
        problem = executable_problem(os.path.join(directory, program))
        if problem is None:
            return None
        if unusable is None and not problem.endswith("does not exist"):
            unusable = problem
    where = f"PATH ({_shown(os.pathsep.join(search))})"
    if unusable is not None:
        return f"program {program!r} not usable in {where}: {unusable}"
    return f"program {program!r} not found in {where}"


def _not_writable(path: str) -> str:
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    why = "read-only filesystem" if read_only else f"for uid {os.geteuid()}"
    return f"{_shown(path)} is not writable ({why})"


def _no_room(directory: str) -> str | None:
    """Why nothing can be created in ``directory`` (its filesystem full as ``df`` says: no
    block or no inode available), or None. A state dir that cannot be made was found only
    by the first ``enforce``, on the full disk it came to rescue.

    ``f_bavail``, not ``f_bfree``, even as root: ext4 keeps clusters back that not even root
    may use (``mkfs -m 0``, 327 blocks "free", mkdir fails with ENOSPC), and diskguard's
    usage is df's anyway."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    if st.f_bavail > 0 and (st.f_favail > 0 or st.f_files == 0):  # f_files 0: no inode limit
        return None
    what = "no block" if st.f_bavail <= 0 else "no inode"
    return f"no space left on {_shown(_mount_of(directory))} ({what} available, as df says)"


def _mount_of(path: str) -> str:
    """The mount point ``path`` is on (the nearest ancestor on another device stops it)."""
    path = os.path.realpath(path)
    dev = os.stat(path).st_dev
    while path != "/":
        parent = os.path.dirname(path)
        if os.stat(parent).st_dev != dev:
            return path
        path = parent
    return path


def state_dir_problem(state_dir: Path, writes: bool = True) -> str | None:
    """What would stop diskguard from keeping its audit log, journal and state in
    ``state_dir`` (which it creates when missing). Nothing is created here: checking a
    config must not change the machine."""
    path = os.path.abspath(state_dir)
    if "\0" in path:
        return f"{_shown(path)} contains a NUL byte"
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(path):
            return f"{_shown(path)} is a symlink to nothing"
        # The nearest existing ancestor must be a directory this process can write to.
        parent = os.path.dirname(path)
        while True:
            try:
                parent_st = os.stat(parent)
            except (FileNotFoundError, NotADirectoryError):
                parent = os.path.dirname(parent)
                continue
            except (OSError, ValueError) as exc:
                return _cannot_check(parent, exc)
            if not stat.S_ISDIR(parent_st.st_mode):
                return f"cannot create {_shown(path)}: {_shown(parent)} is not a directory"
            if writes and not os.access(parent, os.W_OK | os.X_OK):
                return f"cannot create {_shown(path)}: {_not_writable(parent)}"
            if writes:
                full = _no_room(parent)
                if full is not None:
                    return f"cannot create {_shown(path)}: {full}"
            return None
    except (OSError, ValueError) as exc:
        return _cannot_check(path, exc)
    if stat.S_ISREG(st.st_mode):
        return f"{_shown(path)} is a regular file, not a directory"
    if not stat.S_ISDIR(st.st_mode):
        return f"{_shown(path)} is not a directory"
    if writes and not os.access(path, os.W_OK | os.X_OK):
        return _not_writable(path)
    return None


def inside_log_dir(path: Path, log_dirs: list[Path]) -> str | None:
    """Why ``path`` (a state dir or ballast diskguard creates) must not be where it is, or None.

    A Kafka broker refuses to start with anything in a log dir that is not a partition dir
    ("Found directory .../diskguard ... is not in the form of topic-partition"): a state dir
    made there by the first ``enforce --once``, or a ballast in a dir of its own there, would
    keep the broker down after the very rescue diskguard exists for. ``log_dirs`` are
    resolved; ``path`` is resolved here (the part that exists), so a symlink into a log dir
    counts as inside it."""
    real = Path(os.path.realpath(path))
    for log_dir in log_dirs:
        if real == log_dir or log_dir in real.parents:
            return (
                f"{_shown(str(path))} is inside log dir {_shown(str(log_dir))}: a Kafka broker "
                "refuses to start with what is not a topic-partition dir there; put it "
                "outside every log dir"
            )
    return None
