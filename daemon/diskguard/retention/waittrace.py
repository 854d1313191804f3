"""The usage polled while waiting for freed space (pure): whether deletions gave their space
back, told apart from what other writers added meanwhile."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WaitTrace:
    """The usage polled while waiting for freed space, with others' growth told apart from
    the frees: a rise between two polls is someone writing, a drop is space coming back.

    Measured only as the net change over the wait, a free that lands during the wait hides
    as much of others' growth, and that smaller growth rate, stretched back over the unlinks
    and the syncfs before the wait, made the space that did come back look missing (the
    retention stopped beside a steady writer). Rises and drops kept apart cannot cancel."""

    #: ``used_bytes`` at the first measurement (the start of the wait) and at the last poll.
    first: int
    last: int
    rises: int = 0
    drops: int = 0
    #: The largest rise between two paced polls: others write in steps this big, so a
    #: shortfall smaller than one of them is within what their growth alone can explain.
    largest_rise: int = 0

    @classmethod
    def starting(cls, used_bytes: int) -> WaitTrace:
        """A trace whose wait starts at this usage."""
        return cls(first=used_bytes, last=used_bytes)

    def add(self, used_bytes: int, paced: bool = True) -> None:
        """One more poll of the filesystem's ``used_bytes``; ``paced`` when it came one poll
        interval after the last (not across the syncfs, whose rise is many of others'
        steps, not one)."""
        step = used_bytes - self.last
        self.last = used_bytes
        if step > 0:
            self.rises += step
            if paced:
                self.largest_rise = max(self.largest_rise, step)
        else:
            self.drops -= step

    def shown(self, before_used: int, before_wait_s: float, waited_s: float, rate: float) -> int:
        """Bytes the unlinks gave back by the last poll: what was freed before the wait (the
        usage just before the unlinks, plus others' growth until the wait began, minus the
        usage then) and the drops during it. Others' rate is the larger of ``rate`` (known
        beforehand) and the rises over the wait."""
        others = max(rate, self.rises / waited_s if waited_s > 0 else 0.0)
        return before_used + int(others * max(0.0, before_wait_s)) - self.first + self.drops
