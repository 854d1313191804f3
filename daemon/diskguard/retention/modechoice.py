"""Choosing a cycle's mode from the world: the ``.lock`` files, the broker, the usage (edge).

The rule is ``mode.decide_mode`` (pure); this gathers what it needs as cheaply as it can. The
broker is asked only when a plan in the mode the ``.lock`` suggests may choose deletions:
probing a dead broker costs the client's whole timeout, and most cycles delete nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from diskguard.config import Config
from diskguard.host import fsusage
from diskguard.kafkalog import lockfile
from diskguard.retention.ceilings import Ceilings
from diskguard.retention.mode import BROKER, DRY_RUN, ModeDecision, decide_mode

if TYPE_CHECKING:
    from diskguard.broker.client import BrokerClient


class ModeChooser:
    """One config's mode decision. ``ask_broker``: always ask the broker (``plan`` shows the
    mode a cycle would really act in, so it pays for the round trip). ``reachability``: an
    answer already known without a round trip (the daemon's background probe while it
    probes), or None to ask the broker."""

    def __init__(
        self,
        config: Config,
        broker: BrokerClient | None,
        ceilings: Ceilings,
        ask_broker: bool = False,
        reachability: Callable[[], bool | None] | None = None,
    ) -> None:
        self._config = config
        self._broker = broker
        self._ceilings = ceilings
        self._ask_broker = ask_broker
        self._reachability = reachability
        self._reachable_cache: tuple[float, bool] | None = None
        #: The last answer about the broker (None before the first, or without a broker).
        self.last_reachable: bool | None = None

    def locked_log_dirs(self) -> list[str]:
        return [str(d) for d in self._config.broker.log_dirs if lockfile.held_by_other(d)]

    def broker_reachable(self, max_age: float = 10.0) -> bool | None:
        """Cached for ``max_age`` s: probing a dead broker costs its timeout every call."""
        if self._broker is None:
            return None
        now = time.monotonic()
        if self._reachable_cache and now - self._reachable_cache[0] < max_age:
            return self._reachable_cache[1]
        known = self._reachability() if self._reachability is not None else None
        ok = bool(self._broker.reachable()) if known is None else known
        self._reachable_cache = (now, ok)
        self.last_reachable = ok
        return ok

    def forget_reachable(self) -> None:
        """The next decision asks again (the broker answered a probe since)."""
        self._reachable_cache = None

    def decide(self, need_broker: bool) -> ModeDecision:
        configured = self._config.retention.mode
        locked = self.locked_log_dirs()
        reachable: bool | None
        if configured == DRY_RUN:
            reachable = None
        elif need_broker or configured == BROKER:
            reachable = self.broker_reachable()
        else:
            # Nothing to delete: avoid a network round trip, assume what the lock says.
            reachable = (bool(locked) or None) if self._broker is not None else None
        holder = lockfile.holder(locked[0]) if locked and configured != DRY_RUN else None
        return decide_mode(configured, reachable, locked, holder)

    def choose(self) -> ModeDecision:
        """The cycle's one mode decision, before the scan.

        ``plan`` always asks the broker. The daemon and ``enforce`` first take what the
        ``.lock`` says (no network round trip: probing a dead broker costs its timeout) and
        ask the broker only if a plan in that mode may choose deletions (``may_delete``).
        """
        mode = self.decide(need_broker=self._ask_broker)
        if self._ask_broker or self._broker is None or mode.mode == DRY_RUN:
            return mode
        return self.decide(need_broker=True) if self.may_delete(mode.mode) else mode

    def may_delete(self, mode: str) -> bool:
        """Cheap pre-check (one statvfs per filesystem, no listing): may a plan in ``mode``
        choose deletions? It errs towards yes: pending reclaim, which only the scan
        measures, counts as none; a filesystem that cannot be measured does not count."""
        if self._ceilings.byte_budget:
            return True
        try:
            groups = fsusage.group_by_device([str(d) for d in self._config.broker.log_dirs])
        except OSError:
            return True
        for group in groups:
            try:
                usage = fsusage.usage_of(group.paths[0], group.mount, group.device)
            except OSError:
                continue
            if self._ceilings.may_need_space(usage, mode):
                return True
        return False
