"""Work done in a forked child, its results streamed back through a pipe (edge).

Why: a one-shot ``plan`` over a large log dir is Python per name listed and per head dated,
one core busy and the other idle. A forked child sees the parent's memory as it was at the
fork (copy on write), so it needs no inputs sent; what it yields comes back ``marshal``'d
(plain data: tuples, lists, str, int) in length-prefixed chunks. The pipe's capacity bounds
how far ahead of its reader the child works: a stream read only partly costs the child a
pipe's worth of work, then it waits, and ``close`` ends it.

Only where forking is safe (:func:`can_fork`): a process with other threads may fork while
one of them holds a lock the child would need. The child leaves with ``os._exit``: no atexit
handler, no flush of the parent's buffered output, no ``finally`` of the parent's runs twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import marshal
import os
import signal
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["ChildFailed", "ForkedStream", "can_fork"]

_LENGTH = struct.Struct("<I")
_ITEMS, _ERROR, _END = 0, 1, 2
#: How far ahead of its reader a child may work: a pipe of 64 KiB (Linux's default) held
#: a fifth of a 1,000-dir listing, and the child waited while this process listed its own
#: half. 1 MiB is the most an unprivileged process may ask for (``pipe-max-size``).
PIPE_BYTES = 1 << 20
#: Items per message: large enough that marshal and the pipe cost little per item, small
#: enough that the reader starts early.
CHUNK = 256
_FIRST_CHUNK = 8


class ChildFailed(RuntimeError):
    """The child raised something other than an ``OSError`` (those are raised again as they
    were), or ended without saying it was done (killed, out of memory)."""


def can_fork() -> bool:
    """More than one core this process may run on (its affinity: ``taskset``, a cpuset),
    and no other thread in this process: Python's, or a library's own (the Kafka client's
    librdkafka threads, which ``threading`` does not see, are in ``/proc/self/task``)."""
    if not hasattr(os, "fork") or _threads() != 1:
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) > 1


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


class ForkedStream:
    """The items ``produce()`` yields, produced in a forked child, in order.

    ``with contextlib.closing(ForkedStream(lambda: work(args))) as items: ...``. An ``OSError``
    the child raises is raised again here (errno, text and file name kept), anything else as
    :class:`ChildFailed`, both after the items before it.
    """

    def __init__(
        self, produce: Callable[[], Iterable[Any]], chunk: int = CHUNK, pipe_bytes: int = PIPE_BYTES
    ) -> None:
        read_fd, write_fd = os.pipe()
        with contextlib.suppress(OSError, AttributeError):  # a bigger pipe where allowed
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, pipe_bytes)
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        if pid == 0:  # the child: never returns
            os.close(read_fd)
            _serve(produce, write_fd, chunk)
        os.close(write_fd)
        self._pid: int | None = pid
        self._file = os.fdopen(read_fd, "rb")

    def __iter__(self) -> Iterator[Any]:
        read = self._file.read
        while True:
            head = read(_LENGTH.size)
            if len(head) < _LENGTH.size:
                self.close()
                raise ChildFailed("the forked child ended before its work was done")
            body = read(_LENGTH.unpack(head)[0])
            kind, payload = marshal.loads(body)
            if kind == _ITEMS:
                yield from payload
            elif kind == _END:
                self.close()
                return
            else:
                self.close()
                raise _raised(payload)

    def close(self) -> None:
        """End the child (whatever it is doing: it only reads) and reap it."""
        if getattr(self, "_pid", None) is None:
            return
        pid = self._pid
        self._pid = None
        assert pid is not None
        self._file.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

    def __del__(self) -> None:
        self.close()


def _serve(produce: Callable[[], Iterable[Any]], fd: int, chunk: int) -> None:
    """The child's whole life: produce, send, leave (``os._exit``, whatever happens)."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it with the parent
        batch: list[Any] = []
        # The first messages small, then doubling up to ``chunk``: the reader may be waiting
        # for the first item (a plan merging heads), not only for the last.
        size = min(_FIRST_CHUNK, chunk)
        for item in produce():
            batch.append(item)
            if len(batch) >= size:
                _send(fd, _ITEMS, batch)
                batch = []
                size = min(size * 2, chunk)
        if batch:
            _send(fd, _ITEMS, batch)
        _send(fd, _END, None)
    except BrokenPipeError:
        pass  # the reader has what it wanted
    except BaseException as exc:
        code = 1
        with contextlib.suppress(BaseException):
            _send(fd, _ERROR, _described(exc))
    finally:
        os._exit(code)


def _send(fd: int, kind: int, payload: Any) -> None:
    body = marshal.dumps((kind, payload))
    view = memoryview(_LENGTH.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


def _described(exc: BaseException) -> tuple[Any, ...]:
    if isinstance(exc, OSError):
        return ("os", exc.errno, exc.strerror, exc.filename, str(exc))
    return ("other", type(exc).__name__, str(exc))


def _raised(payload: tuple[Any, ...]) -> BaseException:
    if payload[0] == "os":
        _kind, code, strerror, filename, text = payload
        if code is None:
            return OSError(text)
        if filename is None:
            return OSError(code, strerror)
        return OSError(code, strerror, filename)
    _kind, name, text = payload
    return ChildFailed(f"{name}: {text}" if text else name)
