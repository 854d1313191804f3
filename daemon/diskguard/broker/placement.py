"""Where a partition lives in the cluster and where its log starts, as the cluster says (edge).

Broker-mode trimming is cluster-wide: DeleteRecords moves a partition's log start offset on
every replica, and the broker sends it to the partition's leader (librdkafka looks the
leader up). So a plan says which brokers' replicas it also shortens
(``BrokerClient.placement``: leader and replicas), and a guard counts what another broker's
guard trimmed as on its way out of its own disk too: the leader reports the partition's log
start offset (ListOffsets EARLIEST) at once, while a follower's own
``log-start-offset-checkpoint`` says so only up to a minute later.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any

__all__ = ["Placement", "ask_log_start_offsets", "log_start_offsets", "log_start_offsets_of"]

#: (topic, partition) -> (leader broker id or -1, replica broker ids).
Placement = dict[tuple[str, int], tuple[int, tuple[int, ...]]]


def log_start_offsets(
    admin: Any, partitions: Iterable[tuple[str, int]], timeout: float
) -> dict[tuple[str, int], int]:
    """Each partition's log start offset as its leader reports it (ListOffsets EARLIEST,
    routed to the leaders by the client). A partition that fails is left out: nothing is
    then known beyond the local checkpoint. Raises only if the request cannot be sent."""
    return log_start_offsets_of(ask_log_start_offsets(admin, partitions, timeout), timeout)


def ask_log_start_offsets(
    admin: Any, partitions: Iterable[tuple[str, int]], timeout: float
) -> dict[tuple[str, int], Future[Any]]:
    """``log_start_offsets``' request, sent: each partition's answer to come."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]  # re-exported

    earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
    request = {TopicPartition(t, p): earliest for t, p in sorted(set(partitions))}
    if not request:
        return {}
    futures = admin.list_offsets(request, request_timeout=timeout)
    return {(tp.topic, tp.partition): future for tp, future in futures.items()}


def log_start_offsets_of(
    futures: Mapping[tuple[str, int], Future[Any]], timeout: float
) -> dict[tuple[str, int], int]:
    """``log_start_offsets``' answer: each partition's offset, as it comes."""
    out: dict[tuple[str, int], int] = {}
    for key, future in futures.items():
        try:
            offset = future.result(timeout=timeout + 2).offset
        except Exception:  # one partition's failure (a leader moving) hides nothing else
            continue
        if isinstance(offset, int) and offset >= 0:
            out[key] = offset
    return out
