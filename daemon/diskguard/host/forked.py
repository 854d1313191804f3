"""Work done in a forked child, its results streamed back through a pipe (edge).

Why: a one-shot ``plan`` over a large log dir is Python per name listed and per head dated,
one core busy and the other idle. A child forked from the command (``Worker``) does part of
that work; what it yields comes back ``marshal``'d (plain data: tuples, lists, str, int) in
length-prefixed chunks. The pipe's capacity bounds how far ahead of its reader the child
works: a stream read only partly costs the child a pipe's worth of work, then it waits, and
``close`` ends it.

Forked only where that is safe (:func:`can_fork`): a process with other threads may fork
while one of them holds a lock the child would need. So the child is forked before any
client starts its threads and is sent its work later (``Worker.stream``). It leaves with
``os._exit``: no atexit handler, no flush of the parent's buffered output, no ``finally`` of
the parent's runs twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import marshal
import os
import select
import signal
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from diskguard.host.claims import Claims

__all__ = ["ChildFailed", "Claims", "WorkStream", "Worker", "can_fork", "meanwhile"]

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


#: Steps of ``meanwhile`` work between two looks for a waiting request (~15 µs each when
#: they date segment heads: a request waits at most ~0.1 ms).
_STEPS_BETWEEN_LOOKS = 4
#: In the child: what the last request left to do while no request waits (``meanwhile``).
_MEANWHILE: list[Iterator[Any]] = []


def meanwhile(work: Iterator[Any]) -> None:
    """Called in the child by the function of a request: step through ``work`` once this
    request is over, for as long as no next request waits (a look every few steps); ``work``
    keeps what it does in its module's state, for the requests after. The next request
    ends it where it is; so does an error in it (what failed is done again where needed).

    Why: between a plan's listing and its walk the worker waits for this process (its share
    of the listing, its scan, in broker mode the broker's round trips); dating ahead then
    is work the walk does not wait for."""
    _MEANWHILE[:] = [work]


def _in_the_meantime(sock: socket.socket) -> None:
    """The ``meanwhile`` work, until it is done or a request (or the parent's end) waits."""
    if not _MEANWHILE:
        return
    work = _MEANWHILE.pop()
    looks = select.poll()
    looks.register(sock.fileno(), select.POLLIN)
    # Best effort: what fails here is done again by the request that needs it.
    with contextlib.suppress(Exception):
        for step, _ in enumerate(work, 1):
            if step % _STEPS_BETWEEN_LOOKS == 0 and looks.poll(0):
                return


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


class Worker:
    """A child forked early, before any other thread exists, that does work sent to it later.

    Why: the work worth a second core comes late in a command (a plan lists and dates after
    the mode is known), and by then the Kafka client's librdkafka threads may run, which
    makes a fork unsafe (``can_fork``). So the child is forked first (``start``), waits, and
    runs each request when it comes: ``stream(produce, *args)`` calls the module-level
    function ``produce(*args)`` in the child (found there by name; ``args`` plain data that
    ``marshal`` takes) and gives back what it yields, in order (``WorkStream``). The child
    keeps what its module-level state holds between requests (what a plan read, say).

    One request at a time: a new ``stream`` first ends the one before. The child leaves when
    this process closes its end (``close``, exit, or death: the socket's end of file).
    """

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self._sock: socket.socket | None = sock
        self.pid: int | None = pid
        self._current: WorkStream | None = None

    @classmethod
    def start(cls, force: bool = False) -> Worker | None:
        """A worker, or None where forking is not safe or not worth it (``can_fork``;
        ``force``: fork all the same, for tests) or the fork failed (then the caller does
        the work itself)."""
        if not force and not can_fork():
            return None
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            return None
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return None
        if pid == 0:  # the child: never returns
            ours.close()
            _work(theirs)
        theirs.close()
        return cls(ours, pid)

    def stream(
        self,
        produce: Callable[..., Iterable[Any]],
        *args: Any,
        chunk: int = CHUNK,
        claims: int | None = None,
    ) -> WorkStream:
        """``produce(*args)`` run in the child, its items streamed back (``WorkStream``).

        An ``OSError`` the child raises is raised again while iterating (errno, text and
        file name kept), anything else as ``ChildFailed``, both after the items before it;
        so is the child's death. Raises ``ChildFailed`` at once when the worker is gone.
        ``claims``: a count of items this process and the child share from both ends
        (``Claims``): the child gets its side as a last argument, ``WorkStream.claims`` is
        this process's."""
        if self._current is not None:
            self._current.close()
            self._current = None
        if self._sock is None:
            raise ChildFailed("the worker is closed")
        shared: tuple[Claims, int] | None = None
        if claims is not None:
            try:
                shared = Claims.made(claims)
            except OSError as exc:
                raise ChildFailed(f"no memory to share ({exc.strerror or exc})") from exc
        request = marshal.dumps((produce.__module__, produce.__qualname__, args, chunk))
        read_fd, write_fd = os.pipe()
        with contextlib.suppress(OSError, AttributeError):  # a bigger pipe where allowed
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        fds = [write_fd] if shared is None else [write_fd, shared[1]]
        try:
            # The pipe's write end travels with the length (SCM_RIGHTS); the body follows.
            socket.send_fds(self._sock, [_LENGTH.pack(len(request))], fds)
            self._sock.sendall(request)
        except OSError as exc:
            os.close(read_fd)
            self.close()
            raise ChildFailed(f"the worker is gone ({exc.strerror or exc})") from exc
        finally:
            for fd in fds:
                os.close(fd)
        self._current = WorkStream(read_fd, None if shared is None else shared[0])
        return self._current

    def close(self, reap: bool = True) -> None:
        """End the child (whatever it is doing: it only reads) and reap it. ``reap`` False:
        not waiting for it to be gone, for a process about to leave (its children are then
        reaped by init): the kernel tearing down a worker's memory took ~5-20 ms."""
        if self._current is not None:
            self._current.close()
            self._current = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        pid, self.pid = self.pid, None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if reap:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)

    def __del__(self) -> None:
        self.close()


class WorkStream:
    """The items of one request to a ``Worker``, in order. ``close`` (or reading to the end)
    ends it: a child still producing gets a broken pipe and waits for the next request.
    ``drain`` takes what has come so far without waiting, so that a child working ahead is
    not held up by a full pipe while this process does something else."""

    def __init__(self, read_fd: int, claims: Claims | None = None) -> None:
        self._fd: int | None = read_fd
        self._buffer = bytearray()
        self._ready: deque[Any] = deque()
        #: The child's last word came (after the items in ``_ready``): the end, or ``_failure``.
        self._over = False
        self._failure: BaseException | None = None
        self.claims = claims

    def __iter__(self) -> Iterator[Any]:
        ready = self._ready
        while True:
            while ready:
                yield ready.popleft()
            if self._over:
                self.close()
                failure, self._failure = self._failure, None
                if failure is not None:
                    raise failure
                return
            if self._fd is None:
                return
            chunk = os.read(self._fd, PIPE_BYTES)
            if not chunk:
                self.close()
                raise ChildFailed("the worker ended before its work was done")
            self._take(chunk)

    def drain(self) -> None:
        """Read whatever the child has sent by now, without waiting for more."""
        while self._fd is not None and not self._over and select.select([self._fd], [], [], 0)[0]:
            chunk = os.read(self._fd, PIPE_BYTES)
            if not chunk:
                return  # the child is gone: iterating says so
            self._take(chunk)

    def _take(self, chunk: bytes) -> None:
        """Decode every whole message received so far."""
        buffer = self._buffer
        buffer += chunk
        at = 0
        while len(buffer) - at >= _LENGTH.size and not self._over:
            (size,) = _LENGTH.unpack_from(buffer, at)
            end = at + _LENGTH.size + size
            if len(buffer) < end:
                break
            kind, payload = marshal.loads(buffer[at + _LENGTH.size : end])
            at = end
            if kind == _ITEMS:
                self._ready.extend(payload)
            else:
                self._over = True
                self._failure = None if kind == _END else _raised(payload)
        del buffer[:at]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


def _work(sock: socket.socket) -> None:
    """The child's whole life: each request in turn, until the parent's end closes; then
    ``os._exit``, whatever happens."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it with the parent
        while True:
            _in_the_meantime(sock)
            request = _receive(sock)
            if request is None:
                break
            (module, name, args, chunk), fds = request
            try:
                if len(fds) > 1:
                    args = (*args, Claims.mapped(fds[1]))
                _serve(module, name, args, fds[0], chunk)
            finally:
                for fd in fds:
                    os.close(fd)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _receive(sock: socket.socket) -> tuple[Any, list[int]] | None:
    """The next request and its pipe's write end (then its claims' memory, if it has some),
    or None once the parent closed its end."""
    head, fds, _flags, _addr = socket.recv_fds(sock, _LENGTH.size, 2)
    if not head:
        return None
    if not 1 <= len(fds) <= 2:
        raise ChildFailed("a request without its pipe")
    head += _exactly(sock, _LENGTH.size - len(head))
    return marshal.loads(_exactly(sock, _LENGTH.unpack(head)[0])), fds


def _exactly(sock: socket.socket, size: int) -> bytes:
    parts = []
    while size > 0:
        got = sock.recv(min(size, 1 << 20))
        if not got:
            raise ChildFailed("the request ended early")
        parts.append(got)
        size -= len(got)
    return b"".join(parts)


def _resolve(module: str, name: str) -> Callable[..., Iterable[Any]]:
    """The function ``module.name`` in this (the child's) process."""
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found  # type: ignore[no-any-return]


def _serve(module: str, name: str, args: tuple[Any, ...], fd: int, chunk: int) -> None:
    """One request: ``module.name(*args)``'s items sent, then the end or what went wrong. A
    reader gone (the pipe broken) just ends it."""
    try:
        produce = _resolve(module, name)
        batch: list[Any] = []
        # The first messages small, then doubling up to ``chunk``: the reader may be waiting
        # for the first item (a plan merging heads), not only for the last.
        size = min(_FIRST_CHUNK, chunk)
        for item in produce(*args):
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
    except Exception as exc:
        with contextlib.suppress(Exception):
            _send(fd, _ERROR, _described(exc))


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
