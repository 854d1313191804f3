"""Items of a list done from both ends at once by two processes (edge: shared memory).

A plan's forked worker (``host.forked``) and the plan itself share the listing of the
partition dirs this way (``kafkalog.parallellisting``): neither knows beforehand how fast
the other will go.
"""

from __future__ import annotations

import mmap
import os

__all__ = ["Claims"]


class Claims:
    """A list of ``count`` items done from both ends at once: the child takes them from the
    front (``front``), this process from the back (``back``), until they meet. Neither knows
    beforehand how fast the other goes (the child starts early; this process has imports, or
    a broker's round trips, before its share), so a fixed split leaves one of them idle.

    Two counters in memory both processes share (``memfd``, sent with the request): the
    child's next item and this process's lowest. Each side reads the other's counter, then
    writes its own, and does the item: a value read was written, so whatever each side skips
    the other has taken (at worst both do the item where they meet). Counters of one
    request only: a child still running an earlier request has its own.
    """

    def __init__(self, shared: mmap.mmap) -> None:
        self._shared = shared
        self._counters = memoryview(shared).cast("q")

    @classmethod
    def made(cls, count: int) -> tuple[Claims, int]:
        """New counters for ``count`` items, and a descriptor of their memory to send."""
        fd = os.memfd_create("diskguard-claims", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, 16)
            claims = cls(mmap.mmap(fd, 16))
        except BaseException:
            os.close(fd)
            raise
        claims._counters[0] = 0
        claims._counters[1] = count
        return claims, fd

    @classmethod
    def mapped(cls, fd: int) -> Claims:
        """The child's view of the counters the descriptor ``fd`` holds."""
        return cls(mmap.mmap(fd, 16))

    def end_at(self, count: int) -> None:
        """The child, before this process takes any item: there are ``count`` items, not the
        number the counters were made for (a child that finds its list itself and sends it
        first, ``planstart``)."""
        self._counters[1] = count

    def front(self, i: int) -> bool:
        """The child: may it do item ``i`` (the next from the front)? Then it must."""
        if i >= self._counters[1]:
            return False
        self._counters[0] = i + 1
        return True

    def back(self, j: int) -> bool:
        """This process: may it do item ``j`` (the next from the back)? Then it must."""
        if j < self._counters[0]:
            return False
        self._counters[1] = j
        return True
