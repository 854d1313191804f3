"""A one-shot ``plan``'s DescribeLogDirs, asked by a child forked before any client (edge).

Why: broker-mode ``plan`` needs the broker's log dirs (which are offline) after its scan, and
kafka-python's import (~0.14 s of CPU), its connection and the round trip cost that much of
the command. On a thread they overlap the scan but share the interpreter lock with it; in a
child (``host.forked.Worker``, forked while the command has no other thread, and asked at once)
they run on the other core from the command's start, and the command reads a few bytes of
plain data when the ladder asks. The answer
and every failure are the ones the call gives in the command's own process
(``LadderApi.log_dirs``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from diskguard.broker.kafkapython import KafkaPythonAdmin
from diskguard.broker.ladderapi import (
    EarlyAnswer,
    LadderApi,
    LadderCallFailed,
    LogDirInfo,
    ReplicaInfo,
)
from diskguard.config import Config
from diskguard.host.forked import ChildFailed, Worker, WorkStream
from diskguard.kafkalog.serverprops import local_broker_id

#: The broker client's timeout of a one-shot command's cycle (``RetentionCycle``).
CLIENT_TIMEOUT_S = 5.0

__all__ = ["ask_in_child", "log_dirs_in_child"]


def ask_in_child(config: Config, asker: Worker | None) -> tuple[int, EarlyAnswer] | None:
    """DescribeLogDirs of this host's broker (``meta.properties``) sent to ``asker`` now,
    at the command's start: ``(broker id, its answer to come)``; None where there is no
    child, no broker, no known id, or the child is gone (then the ladder asks itself)."""
    broker = config.broker
    broker_id = local_broker_id(broker.log_dirs)
    if asker is None or not broker.bootstrap_servers or broker_id is None:
        return None
    try:
        stream = asker.stream(
            log_dirs_in_child,
            broker.bootstrap_servers,
            dict(broker.client),
            CLIENT_TIMEOUT_S,
            broker_id,
        )
    except ChildFailed:
        return None
    return broker_id, _AskedInChild(stream)


class _AskedInChild:
    """``LadderApi``'s ``EarlyAnswer`` from the child's stream."""

    def __init__(self, stream: WorkStream) -> None:
        self._stream = stream

    def answer(self) -> list[LogDirInfo] | None:
        try:
            items = list(self._stream)
        except (OSError, ChildFailed) as exc:
            raise LadderCallFailed(f"DescribeLogDirs: {type(exc).__name__}: {exc}") from exc
        for kind, value in items:
            if kind == "failed":
                raise LadderCallFailed(value)
            return [_dir_of(plain) for plain in value]
        return None

    @property
    def waiting(self) -> bool:
        return False  # the child is ended with its worker (``Worker.close``)


def log_dirs_in_child(
    bootstrap: str | None,
    client: dict[str, str | int | float | bool],
    timeout: float,
    broker_id: int,
) -> Iterator[tuple[str, Any]]:
    """The child's side: the broker's log dirs (no replica) as plain data,
    ``("answer", [dir, ...])``, or ``("failed", text)``: the ``LadderCallFailed`` the same
    call raises in the command's own process."""
    api = LadderApi(None, KafkaPythonAdmin(bootstrap, client, timeout, "the ladder"), timeout)
    try:
        dirs = api.log_dirs(broker_id)
    except LadderCallFailed as exc:
        yield ("failed", str(exc))
        return
    finally:
        api.close()
    yield ("answer", [_plain_dir(d) for d in dirs])


def _plain_dir(d: LogDirInfo) -> tuple[Any, ...]:
    replicas = [(r.topic, r.partition, r.bytes, r.future, r.offset_lag) for r in d.replicas]
    return (d.path, d.error, d.total_bytes, d.usable_bytes, d.cordoned, replicas)


def _dir_of(plain: Sequence[Any]) -> LogDirInfo:
    path, error, total, usable, cordoned, replicas = plain
    return LogDirInfo(
        path, error, total, usable, cordoned, tuple(ReplicaInfo(*r) for r in replicas)
    )
