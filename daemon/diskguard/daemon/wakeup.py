"""What wakes the loop: a self-pipe, so that setting it takes no lock.

A signal handler runs on the main thread between any two bytecodes, including while that
thread is inside ``threading.Event.wait`` holding the event's lock for a moment. A handler
that then sets the same event waits for a lock its own thread holds: the daemon never
stopped on SIGTERM. Writing a byte to a pipe takes no lock, so the handler (and every other
thread) may wake the loop at any point of its wait (gunicorn's arbiter does the same).
"""

from __future__ import annotations

import contextlib
import os
import select
import time
import weakref
from collections.abc import Callable


class Wakeup:
    """``set`` from anywhere (a thread, a signal handler); ``wait`` and ``clear`` from the
    loop. Pending wakes are bytes in the pipe: ``clear`` reads them all."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self._r, select.POLLIN)
        # Closed only once nothing refers to this object any more, so no thread can write
        # into a descriptor number reused by someone else's file.
        weakref.finalize(self, _close, self._r, self._w)

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: a wake is pending anyway
            os.write(self._w, b"\0")

    def wait(self, timeout: float | None) -> bool:
        """Until set or ``timeout`` seconds (None: no limit); whether it was set."""
        ms = None if timeout is None else max(0, int(timeout * 1000.0 + 0.999))
        return bool(self._poll.poll(ms))

    def settle(self, seconds: float, stopping: Callable[[], bool]) -> None:
        """Wait ``seconds`` whatever else wakes it meanwhile (what woke it is read again
        after), unless ``stopping()``."""
        deadline = time.monotonic() + seconds
        while not stopping():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.wait(left)
            if not stopping():
                self.clear()

    def clear(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass  # drained


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
