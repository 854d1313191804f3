"""Open a file found in a log dir for reading without ever blocking on it (edge).

A plain ``open()`` of a FIFO blocks until some process opens its other end, which in a
log dir is never: one FIFO named ``cleaner-offset-checkpoint`` or ``.lock`` would hang
``plan``, ``enforce`` and ``status`` forever, and the daemon's loop with them. So every read
of a log-dir file goes through :func:`open_regular`:

- ``O_NONBLOCK`` makes the ``open`` itself return at once whatever the file is (a FIFO, a
  device); ``fstat`` on the descriptor then says what was really opened — no window between
  a check and the open for the name to be swapped;
- anything but a regular file is closed again and refused with :class:`NotRegularFile`, an
  ``OSError`` naming the path and what it is, so callers that already handle "cannot read"
  warn and carry on;
- ``O_NOFOLLOW``: a symlink is never followed out of a log dir (``ELOOP``);
- ``O_NONBLOCK`` has no effect on reads of a regular file, so it stays set.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = [
    "NotRegularFile",
    "TooLarge",
    "open_regular",
    "open_regular_stat",
    "read_bytes",
    "read_text",
    "what_is",
]

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class NotRegularFile(OSError):
    """The path names a FIFO, socket, device or directory where a regular file belongs."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        self.path = os.fspath(path)
        self.kind = kind
        super().__init__(errno.EINVAL, f"not a regular file ({kind})", self.path)

    def __str__(self) -> str:
        return f"{self.path}: not a regular file ({self.kind}); not read"


class TooLarge(OSError):
    """The regular file is larger than the reader's bound (a config, say, that is really a
    disk image or a log): refused before it is read into memory."""

    def __init__(self, path: str | os.PathLike[str], limit: int) -> None:
        self.path = os.fspath(path)
        self.limit = limit
        super().__init__(errno.EFBIG, f"larger than {_size(limit)}", self.path)

    def __str__(self) -> str:
        return f"{self.path}: larger than {_size(self.limit)}; not read"


def _size(nbytes: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor} {unit}"
    return f"{nbytes} bytes"


def what_is(mode: int) -> str:
    """A short name for the file type in ``mode`` (for messages)."""
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the regular file ``path``; never blocks, never follows a
    symlink. Raises :class:`NotRegularFile` for anything else, OSError if it cannot be
    opened (FileNotFoundError when missing). The caller closes the descriptor."""
    return open_regular_stat(path)[0]


def open_regular_stat(
    path: str | os.PathLike[str], follow: bool = False
) -> tuple[int, os.stat_result]:
    """:func:`open_regular`, plus the ``fstat`` it checked the descriptor with: a caller that
    needs the file's size or identity has it without another system call. ``follow``: a
    symlink is followed (a config file the operator points at, never a log-dir file)."""
    try:
        fd = os.open(path, _FLAGS & ~os.O_NOFOLLOW if follow else _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(path, "symlink") from None
        raise
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFile(path, what_is(st.st_mode))
    return fd, st


def read_bytes(
    path: str | os.PathLike[str], limit: int | None = None, follow: bool = False
) -> bytes:
    """The whole content of the regular file ``path`` (see :func:`open_regular`).

    ``limit``: refuse (:class:`TooLarge`) a file larger than this many bytes, judged by what
    is read, not only by the size ``fstat`` gave (a file may grow while it is read).
    ``follow``: see :func:`open_regular_stat`."""
    fd, st = open_regular_stat(path, follow)
    try:
        if limit is not None and st.st_size > limit:
            raise TooLarge(path, limit)
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            total += len(chunk)
            if limit is not None and total > limit:
                raise TooLarge(path, limit)
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], errors: str = "strict") -> str:
    """:func:`read_bytes` decoded as UTF-8; ValueError (UnicodeDecodeError) on bad bytes
    unless ``errors`` says otherwise."""
    return read_bytes(path).decode("utf-8", errors=errors)
