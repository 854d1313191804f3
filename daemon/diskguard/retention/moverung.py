"""Rung 3 against the broker (edge): move whole replicas between this broker's log dirs, and
time each move.

AlterReplicaLogDirs makes the broker copy the replica into ``<target>/<tp>.<id>-future``,
let it catch up, swap, and rename the old dir ``-delete`` (removed after its file delete
delay): measured on Kafka 4.4, a 20 MB replica in 0.9 s. Until the swap the source still
holds every byte, and the target already holds the copy: a move in flight counts as on its
way out of the source (``Ceilings``) and as coming into the target (its room,
``ladder.TargetDir``). Moves are recorded (``ladderstate``) before they are asked, and timed
from the request to the moment the broker reports the replica in its target and no longer in
its source: that copy rate plans the next moves.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from diskguard.broker.ladderapi import LadderApi, LadderCallFailed, LogDirInfo
from diskguard.kafkalog.scan import ScanResult
from diskguard.logs import get_logger
from diskguard.retention.audit import AuditLog
from diskguard.retention.ladder import BALANCE, Move
from diskguard.retention.ladderstate import LadderState, MoveInFlight, move_key
from diskguard.retention.mode import BROKER
from diskguard.retention.rungaudit import RungResult, rung_intent, rung_outcome

log = get_logger("diskguard.ladder")

#: A move the broker no longer reports (no ``-future`` copy, still in its source dir) this
#: long after it was asked has failed.
MOVE_LOST_S = 60.0


def real(path: str) -> str:
    return os.path.realpath(path)


class MoveRung:
    """Replica moves through ``api`` on broker ``broker_id``; ``state`` holds those in flight."""

    def __init__(self, api: LadderApi, broker_id: int, state: LadderState, audit: AuditLog) -> None:
        self.api = api
        self.broker_id = broker_id
        self.state = state
        self.audit = audit

    def move(self, moves: tuple[Move, ...], usage_before: Mapping[str, float]) -> list[RungResult]:
        started = time.monotonic()
        asked: dict[tuple[str, int], tuple[Move, str]] = {}
        for move in moves:
            action = rung_intent(
                self.audit,
                {
                    "kind": "move",
                    "rung": BALANCE,
                    "mode": BROKER,
                    "topic": move.topic,
                    "partition": move.partition,
                    "log_dir": move.source_dir,
                    "target_dir": move.target_dir,
                    "mount": move.mount,
                    "bytes": move.bytes,
                    "expected_s": round(move.expected_s, 1),
                    "usage_before_percent": round(usage_before.get(move.mount, 0.0), 3),
                    "reason": "log dir's filesystem over its limit; another log dir of this "
                    "broker has room: moved whole, nothing lost",
                    "scope": "local: this broker's replica only",
                },
            )
            if action is not None:
                asked[(move.topic, move.partition)] = (move, action)
        if not asked:
            return []
        now_ms = int(time.time() * 1000)
        with self.state.change() as data:
            for move, _action in asked.values():
                data.moves[move_key(move.topic, move.partition)] = MoveInFlight(
                    move.topic,
                    move.partition,
                    move.source_dir,
                    move.target_dir,
                    move.bytes,
                    move.mount,
                    now_ms,
                    started,
                )
        try:
            errors = self.api.move_replicas(
                self.broker_id, {key: m.target_dir for key, (m, _a) in asked.items()}
            )
        except LadderCallFailed as exc:
            errors = dict.fromkeys(asked, str(exc))
        results = []
        for key, (move, action) in asked.items():
            error = errors.get(key)
            rung_outcome(self.audit, action, error is None, 0 if error else move.bytes, error)
            if error is None:
                log.info(
                    "replica_move_started",
                    topic=move.topic,
                    partition=move.partition,
                    source_dir=move.source_dir,
                    target_dir=move.target_dir,
                    bytes=move.bytes,
                    expected_s=round(move.expected_s, 1),
                )
            else:
                with self.state.change() as data:
                    data.moves.pop(move_key(*key), None)
                log.error(
                    "replica_move_failed", topic=move.topic, partition=move.partition, error=error
                )
            results.append(
                RungResult(
                    BALANCE,
                    move_key(*key),
                    error is None,
                    move.bytes,
                    error,
                    {move.mount: move.bytes},
                )
            )
        return results

    def settle(self, dirs: list[LogDirInfo]) -> None:
        """The moves the broker finished (the replica in its target, no longer in its
        source) are timed and forgotten; one it lost (no copy under way, still in its
        source, long after it was asked) fails."""
        where: dict[tuple[str, int], list[tuple[str, bool]]] = {}
        for info in dirs:
            for rep in info.replicas:
                replica = (rep.topic, rep.partition)
                where.setdefault(replica, []).append((real(info.path), rep.future))
        for key, move in self.state.moves().items():
            seen = where.get((move.topic, move.partition), [])
            target, source = real(move.target_dir), real(move.source_dir)
            if (target, False) in seen and not any(path == source for path, _f in seen):
                self._done(key, move)
            elif (
                not any(future for _p, future in seen)
                and time.time() - move.started_ms / 1000 > MOVE_LOST_S
            ):
                with self.state.change() as data:
                    data.moves.pop(key, None)
                log.error(
                    "replica_move_failed",
                    topic=move.topic,
                    partition=move.partition,
                    error="the broker no longer copies it (restarted, or the move was "
                    "cancelled) and it is still in its source dir",
                )

    def _done(self, key: str, move: MoveInFlight) -> None:
        seconds = None if move.started_at is None else time.monotonic() - move.started_at
        with self.state.change() as data:
            data.moves.pop(key, None)
            if seconds is not None and seconds > 0:
                rate = move.bytes / seconds
                # Smoothed: one move's rate is noisy (a small replica's is mostly latency).
                data.move_rate = rate if data.move_rate is None else (data.move_rate + rate) / 2
        log.info(
            "replica_move_done",
            topic=move.topic,
            partition=move.partition,
            target_dir=move.target_dir,
            bytes=move.bytes,
            seconds=None if seconds is None else round(seconds, 2),
        )


def moving_bytes(state: LadderState) -> dict[str, int]:
    """Per source mount: bytes of replicas being moved off it (on their way out)."""
    out: dict[str, int] = {}
    for move in state.moves().values():
        out[move.source_mount] = out.get(move.source_mount, 0) + move.bytes
    return out


def replicas_wanted(
    scan: ScanResult, balance: bool, moves: Mapping[str, MoveInFlight]
) -> dict[str, list[int]]:
    """The replicas whose sizes DescribeLogDirs must say (topic -> partitions): every scanned
    one where the balance rung may move some (on, and log dirs on two devices or more), else
    those moving (their completion is seen in the answer), else none: the log dirs' state
    (offline, cordoned) needs no replica."""
    out: dict[str, list[int]] = {}
    if balance and len({fs.usage.device for fs in scan.filesystems}) >= 2:
        for part in (p for fs in scan.filesystems for d in fs.log_dirs for p in d.partitions):
            out.setdefault(part.topic, []).append(part.partition)
        return out
    for move in moves.values():
        out.setdefault(move.topic, []).append(move.partition)
    return out
