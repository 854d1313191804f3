"""A one-shot ``plan``'s DescribeLogDirs, asked by a child forked before any client (edge).

Why: broker-mode ``plan`` needs the broker's log dirs (which are offline) after its scan, and
kafka-python's import (~0.14 s of CPU), its connection and the round trip cost that much of
the command. On a thread they overlap the scan but share the interpreter lock with it; in a
child (``host.forked.Worker``, forked while the command has no other thread) they run on the
other core, and the command reads a few bytes of plain data when the ladder asks. The answer
and every failure are the ones the call gives in the command's own process
(``LadderApi.log_dirs``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from diskguard.broker.kafkapython import KafkaPythonAdmin
from diskguard.broker.ladderapi import LadderApi, LadderCallFailed, LogDirInfo, ReplicaInfo
from diskguard.host.forked import ChildFailed, Worker, WorkStream

__all__ = ["ask_in_child", "log_dirs_in_child"]


def ask_in_child(api: LadderApi, broker_id: int, asker: Worker) -> _AskedInChild | None:
    """DescribeLogDirs for ``broker_id`` sent to ``asker`` now (None: the child is gone)."""
    kafka = api.kafka
    try:
        stream = asker.stream(
            log_dirs_in_child, kafka.bootstrap, kafka.client, api.timeout, broker_id
        )
    except ChildFailed:
        return None
    return _AskedInChild(stream)


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
