"""Rung 2 against the broker (edge): cordon the log dirs of a filesystem at the first alert
level, lift the cordon when the alert clears.

A cordoned log dir (KIP-1066, Kafka 4.3+: the dynamic broker config ``cordoned.log.dirs``)
gets no new replica: a topic created, or partitions added, while a disk fills land on the
other dirs (measured on 4.4; with every dir of the broker cordoned, creating a topic there
fails "All brokers are currently fenced, or have all their log directories cordoned"). A
cordoned dir cannot receive a moved replica either, which is why only the filling dirs are
cordoned. diskguard lifts only the cordons it set (``ladderstate``), never an operator's; it
writes each down before asking the broker, so a crash in between is lifted later all the
same (SUBTRACT of an absent entry is harmless). A broker without the setting (before 4.3) is
said once (``cordon_unavailable``), then left alone. Never every log dir of the broker
(``cordon_skipped``): that would keep the whole broker from new replicas, so that a topic
needing it could not be created, a cluster decision left to the operator; cordons steer new
replicas to the broker's other dirs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from diskguard.broker.ladderapi import LadderApi, LadderCallFailed, LogDirInfo
from diskguard.logs import get_logger
from diskguard.retention.ladderstate import LadderState

log = get_logger("diskguard.ladder")


class Cordon:
    """Cordons on broker ``broker_id`` through ``api``, as the alert levels ask."""

    def __init__(self, api: LadderApi, broker_id: int, state: LadderState) -> None:
        self.api = api
        self.broker_id = broker_id
        self.state = state
        #: None until asked; False: the broker has no cordoned.log.dirs (said once).
        self.available: bool | None = None
        self._failing = False
        self._all_filling = False

    def converge(
        self,
        levels: Mapping[str, int],
        dirs_by_mount: Mapping[str, Sequence[str]],
        broker_dirs: Sequence[LogDirInfo] | None,
    ) -> None:
        """Cordon the dirs of each mount at alert level >= 1, lift ours elsewhere.
        ``broker_dirs``: the broker's own spelling of its log dirs (DescribeLogDirs), used
        for the names it is given; the config's real paths otherwise."""
        named = {os.path.realpath(d.path): d.path for d in broker_dirs or ()}
        want: dict[str, tuple[str, int]] = {}
        for mount, level in levels.items():
            if level >= 1:
                for path in dirs_by_mount.get(mount, ()):
                    want[named.get(os.path.realpath(path), path)] = (mount, level)
        every = {d.path for d in broker_dirs or () if d.online} or {
            named.get(os.path.realpath(p), p) for paths in dirs_by_mount.values() for p in paths
        }
        operators = {d.path for d in broker_dirs or () if d.cordoned} - set(self.state.cordoned())
        if want and every <= set(want) | operators:
            # Every log dir of the broker filling: cordoning them all would keep the whole
            # broker from new replicas (a topic needing it could not be made): a cluster
            # decision, left to the operator. Cordons steer replicas within the broker.
            if not self._all_filling:
                self._all_filling = True
                log.info(
                    "cordon_skipped",
                    log_dirs=sorted(want),
                    reason="every log dir of this broker is filling: cordoning them all "
                    "would fence the broker from new replicas (a cluster decision, left to "
                    "the operator)",
                )
            want = {}
        else:
            self._all_filling = False
        have = set(self.state.cordoned())
        add = sorted(set(want) - have)
        lift = sorted(have - set(want))
        if not add and not lift:
            return
        if not self._available():
            return
        try:
            if add:
                with self.state.change() as data:
                    data.cordoned = sorted({*data.cordoned, *add})
                self.api.cordon(self.broker_id, add, add=True)
                mount, level = want[add[0]]
                log.info("log_dir_cordoned", log_dirs=add, mount=mount, alert_level=level)
            if lift:
                self.api.cordon(self.broker_id, lift, add=False)
                with self.state.change() as data:
                    data.cordoned = sorted(set(data.cordoned) - set(lift))
                log.info("log_dir_uncordoned", log_dirs=lift, mount=None, alert_level=0)
            self._failing = False
        except LadderCallFailed as exc:
            if not self._failing:
                self._failing = True
                log.warning("cordon_unavailable", error=str(exc))

    def _available(self) -> bool:
        if self.available is None:
            try:
                self.available = self.api.cordoned(self.broker_id) is not None
            except LadderCallFailed as exc:
                if not self._failing:
                    self._failing = True
                    log.warning("cordon_unavailable", error=str(exc))
                return False
            if not self.available:
                log.warning(
                    "cordon_unavailable",
                    error="the broker has no cordoned.log.dirs setting (KIP-1066, Kafka 4.3+): "
                    "new replicas may still be placed in a filling log dir",
                )
        return self.available
