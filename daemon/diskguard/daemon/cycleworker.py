"""The retention cycle runs here, beside the loop, one at a time.

A cycle may wait on the broker (a client timeout when it hangs) and on the disk (a scan of a
large tree); the loop meanwhile keeps polling usage and stepping flow control, and can stop
without waiting for the broker to answer. The cycle's outcome is handed back to the loop,
which alone applies it: nothing the loop owns is touched from here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from diskguard.logs import get_logger

log = get_logger("diskguard.daemon")

T = TypeVar("T")


class CycleWorker(Generic[T]):
    """One thread; ``submit`` a cycle while ``idle``, ``take`` its result once it is done.
    ``wake`` is called when a result is ready."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._work: Callable[[], T] | None = None
        self._result: tuple[T | None] | None = None
        self._ready = threading.Condition(self._lock)
        self._done = threading.Event()
        self._done.set()
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def idle(self) -> bool:
        """No cycle under way and no result waiting to be taken."""
        with self._lock:
            return self._work is None and self._result is None

    def submit(self, work: Callable[[], T]) -> None:
        """Run ``work`` (a cycle) on the worker thread. Only while ``idle``."""
        with self._lock:
            if self._work is not None or self._result is not None:
                raise RuntimeError("a cycle is already under way")
            if self._closed:
                return
            self._work = work
            self._done.clear()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="diskguard-cycle", daemon=True
                )
                self._thread.start()
            self._ready.notify()

    def take(self) -> tuple[T | None] | None:
        """``(result,)`` of the cycle that finished (``(None,)`` if it raised), or None while
        one runs or none was submitted. Each result is taken once."""
        with self._lock:
            result, self._result = self._result, None
            return result

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the cycle under way; True once none runs."""
        return self._done.wait(max(0.0, timeout))

    def close(self) -> None:
        """No more cycles; the thread ends once the one under way (if any) returns."""
        with self._lock:
            self._closed = True
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._work is None and not self._closed:
                    self._ready.wait()
                if self._work is None:
                    return
                work = self._work
            result: T | None = None
            try:
                result = work()
            except Exception as exc:  # a cycle must never end the thread
                log.exception("cycle_failed", error=f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._work = None
                self._result = (result,)
                self._done.set()
            self._wake()
