"""One timeout per retention cycle: a hung broker is waited out once, not once per request.

A hung broker (a stopped process: the kernel still accepts its connections, nothing answers)
makes every request wait out the client's whole timeout. A retention cycle asks for the
consumer groups' offsets, the leaders and DeleteRecords in a row, so one cycle waited three
timeouts. Within a cycle (``cycle``, on the thread that runs it), once one request has waited
out the timeout without an answer, the rest fail at once with that reason: the
``BrokerClient``'s, and the ladder's through kafka-python (DescribeLogDirs, tiered offsets,
config changes), which share it. A partial answer cut short by the timeout counts as one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class BrokerHung(Exception):
    """A request not sent: an earlier one of this cycle got no answer within the timeout."""


class OneTimeout:
    """Per thread: whether the cycle under way there already waited out ``timeout``."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._local = threading.local()

    @contextlib.contextmanager
    def cycle(self) -> Iterator[None]:
        """A retention cycle on this thread (requests outside one are never cut short)."""
        self._local.active = True
        self._local.hung = None
        try:
            yield
        finally:
            self._local.active = False
            self._local.hung = None

    def check(self) -> None:
        """Before a request: raise ``BrokerHung`` if one of this cycle got no answer."""
        if getattr(self._local, "active", False):
            reason: str | None = getattr(self._local, "hung", None)
            if reason is not None:
                raise BrokerHung(reason)

    def waited_out(self, started: float, error: str) -> None:
        """A request of this cycle, started at ``started`` (monotonic), failed with ``error``:
        if it took the whole timeout, the broker does not answer."""
        if getattr(self._local, "active", False) and (
            time.monotonic() - started >= 0.9 * self.timeout
        ):
            self._local.hung = (
                f"the broker did not answer within {self.timeout:g} s earlier in this cycle "
                f"({error})"
            )
