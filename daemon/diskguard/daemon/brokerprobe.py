"""Is the broker back? Asked from a thread of its own while retention is stuck without it.

A filesystem over its limit can be stuck for want of the broker: in ``auto`` mode with the
log dirs' ``.lock`` held by another process and the broker not answering, retention is
refused (no unlinking under a live broker, no DeleteRecords without one); with the broker
down, topics whose cleanup policy only it knows are kept; in ``broker`` mode DeleteRecords
fails. The loop then skips cycles and backs its rescans off to a minute (``retention.stuck``),
so a broker that answered again would be noticed up to a minute late, with the disk still
over its limit. This thread probes every interval while asked to, and wakes the loop the
moment the broker answers. While it probes, the cycle takes its answer (``answer``) instead
of waiting out the client's timeout itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from diskguard.logs import get_logger

log = get_logger("diskguard.daemon")


class BrokerProbe:
    """``want(True)`` starts probing every ``interval`` s; an answer sets ``take_back()`` once,
    stops probing and calls ``wake``."""

    def __init__(
        self, probe: Callable[[], bool], interval: float, wake: Callable[[], None]
    ) -> None:
        self._probe = probe
        self.interval = interval
        self._wake = wake
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._back = threading.Event()
        self._last: bool | None = None
        self._thread = threading.Thread(
            target=self._run, name="diskguard-broker-probe", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Ends the thread; a probe under way may take up to the client's timeout, which is
        waited for at most ``timeout`` s. True if it is still under way then (the thread
        dies with the process)."""
        self._stop.set()
        self._wanted.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, timeout))
        return self._thread.is_alive()

    def want(self, wanted: bool) -> None:
        """Probe while ``wanted`` (retention refused for want of the broker), else idle."""
        if wanted:
            self._wanted.set()
        else:
            self._wanted.clear()
            self._last = None

    @property
    def probing(self) -> bool:
        return self._wanted.is_set() and not self._stop.is_set()

    def answer(self) -> bool | None:
        """While probing, the last probe's answer (None before the first, or when not probing:
        then whoever asks must ask the broker itself)."""
        return self._last if self.probing else None

    def take_back(self) -> bool:
        """Did the broker answer since the last call? (Each answer is taken once.)"""
        if not self._back.is_set():
            return False
        self._back.clear()
        return True

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            if self._stop.is_set():
                return
            try:
                answered = self._probe()
            except Exception as exc:  # a probe must never end the thread
                log.debug("broker_probe_failed", error=f"{type(exc).__name__}: {exc}")
                answered = False
            if self._stop.is_set():
                return
            if answered and self._wanted.is_set():
                self._wanted.clear()
                self._last = None
                self._back.set()
                log.info("broker_reachable_again")
                self._wake()
            else:
                self._last = answered if self._wanted.is_set() else None
                self._stop.wait(self.interval)
