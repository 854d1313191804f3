"""The broker edge: DeleteRecords, reachability and committed consumer offsets, through
confluent-kafka's ``AdminClient``.

Size: over 400 lines: one client for every confluent-kafka admin call a cycle makes, so that
they share one timeout per cycle (``one_timeout``), one error wording and one log bridge;
split by call, each part would need the others' rules (the ladder's config calls reuse the
same ``admin``).

With the broker running, segments are deleted *through* it: ``DeleteRecords`` moves the
partition's log start offset to the end of the chosen segments, and the broker removes the
files itself at its next retention check (``log.retention.check.interval.ms``) plus
``log.segment.delete.delay.ms``. So a successful result's ``freed_bytes`` is what the broker
*will* reclaim (the segment's bytes), not space already free — the planner counts it as
pending reclaim until the files are gone.

Nothing here raises into the daemon loop: every broker answer, error or timeout becomes a
result (or an empty answer plus a warning). The admin client is injected (``admin=``) so the
request/response handling is tested at the AdminClient boundary with a fake that returns
futures shaped like confluent-kafka's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from diskguard.broker.authz import Authorized, authorized_operations, describe_acls_error
from diskguard.broker.errors import describe_error, is_lasting, rdkafka_logger
from diskguard.broker.patience import BrokerHung, OneTimeout
from diskguard.broker.placement import (
    Placement,
    ask_log_start_offsets,
    log_start_offsets,
    log_start_offsets_of,
)
from diskguard.logs import get_logger
from diskguard.retention.planner import NO_OFFSET, Deletion, DeletionResult

if TYPE_CHECKING:
    import concurrent.futures

    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

# confluent_kafka (librdkafka) is imported where a broker is really asked: ``plan``, ``status``
# and ``check-config`` without a broker never pay for loading it.

__all__ = ["MODE", "AdminApi", "AskedOffsets", "BrokerClient", "DeletionResult", "describe_error"]

log = get_logger("diskguard.broker")

MODE = "broker"

#: Topic configs that decide whether diskguard may delete a topic's segments (topicpolicy).
TOPIC_POLICY_KEYS = ("cleanup.policy", "remote.storage.enable")


class AdminApi(Protocol):
    """The part of ``confluent_kafka.admin.AdminClient`` diskguard uses."""

    def list_topics(self, *args: Any, **kwargs: Any) -> Any: ...

    def describe_cluster(self, **kwargs: Any) -> concurrent.futures.Future[Any]: ...

    def describe_topics(
        self, topics: Any, **kwargs: Any
    ) -> Mapping[str, concurrent.futures.Future[Any]]: ...

    def delete_records(
        self, topic_partition_offsets: list[TopicPartition], **kwargs: Any
    ) -> Mapping[TopicPartition, concurrent.futures.Future[Any]]: ...

    def list_consumer_groups(self, **kwargs: Any) -> concurrent.futures.Future[Any]: ...

    def list_consumer_group_offsets(
        self, list_consumer_group_offsets_request: list[ConsumerGroupTopicPartitions], **kwargs: Any
    ) -> Mapping[str, concurrent.futures.Future[Any]]: ...

    def describe_configs(
        self, resources: list[Any], **kwargs: Any
    ) -> Mapping[Any, concurrent.futures.Future[Any]]: ...


class BrokerClient:
    """One AdminClient for the local broker's cluster."""

    def __init__(
        self,
        bootstrap: str,
        client_settings: Mapping[str, str | int | float | bool] | None = None,
        timeout: float = 5.0,
        admin: AdminApi | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        if admin is None:
            from confluent_kafka.admin import AdminClient

            conf: dict[str, str | int | float | bool] = {
                "bootstrap.servers": bootstrap,
                "client.id": "diskguard",
                **dict(client_settings or {}),
            }
            admin = AdminClient(conf, logger=rdkafka_logger())
        self._admin: AdminApi = admin
        #: A retention cycle's calls wait out one timeout in all (``one_timeout``).
        self._patience = OneTimeout(timeout)

    @property
    def admin(self) -> AdminApi:
        """The AdminClient itself, for the other config calls (``ladderapi``)."""
        return self._admin

    def close(self) -> None:
        """Serve pending log callbacks; the AdminClient itself has no close."""
        self._serve_logs()

    def _serve_logs(self) -> None:
        poll = getattr(self._admin, "poll", None)
        if poll is not None:
            with contextlib.suppress(Exception):
                poll(0)

    @property
    def patience(self) -> OneTimeout:
        """The retention cycle's one timeout, for calls made through other clients (the
        ladder's)."""
        return self._patience

    def one_timeout(self) -> AbstractContextManager[None]:
        """A retention cycle's calls on this thread wait out one timeout in all
        (``patience.OneTimeout``)."""
        return self._patience.cycle()

    # -- reachability --------------------------------------------------------------------
    def reachable(self, quiet: bool = False) -> bool:
        """Metadata round trip within ``timeout``: is a broker answering at ``bootstrap``?
        ``quiet``: a failure is a debug line (the daemon's background probe, which repeats
        every interval).

        A Metadata request for no topic (DescribeCluster): its answer is the brokers only,
        ~60 bytes; asking for every topic, as ``list_topics`` does, answered ~27 bytes per
        partition (540 KB at 20,000 partitions) and built a Python object for each, every
        time the mode was decided."""
        started = time.monotonic()
        try:
            self._patience.check()
            self._admin.describe_cluster(request_timeout=self.timeout).result(
                timeout=self.timeout + min(2.0, self.timeout)
            )
            return True
        except Exception as exc:
            error = describe_error(exc)
            self._patience.waited_out(started, error)
            if quiet:
                log.debug("broker_unreachable", bootstrap=self.bootstrap, error=error)
            else:
                log.info("broker_unreachable", bootstrap=self.bootstrap, error=error)
            return False
        finally:
            self._serve_logs()

    # -- DeleteRecords -------------------------------------------------------------------
    def delete_records(self, deletions: Sequence[Deletion]) -> list[DeletionResult]:
        """One DeleteRecords request for all partitions (up to each partition's highest
        ``next_offset``); one result per deletion, in input order. Never raises."""
        if not deletions:
            return []
        wanted: dict[tuple[str, int], int] = {}
        for d in deletions:
            key = (d.topic, d.partition)
            wanted[key] = max(wanted.get(key, 0), d.next_offset)
        from confluent_kafka import TopicPartition

        request = [TopicPartition(t, p, off) for (t, p), off in wanted.items()]
        outcome: dict[tuple[str, int], tuple[int | None, str | None]] = {}
        lasting: set[tuple[str, int]] = set()  # refused until an ACL or config changes
        started = time.monotonic()
        futures: Mapping[Any, concurrent.futures.Future[Any]] = {}
        try:
            self._patience.check()
            futures = self._admin.delete_records(
                request, request_timeout=self.timeout, operation_timeout=self.timeout
            )
        except Exception as exc:
            local_error = describe_error(exc)
            for key in wanted:
                outcome[key] = (None, local_error)
        deadline = time.monotonic() + self.timeout + min(2.0, self.timeout)
        for tp, future in futures.items():
            key = (tp.topic, tp.partition)
            try:
                answer = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                outcome[key] = (None, describe_error(exc))
                self._patience.waited_out(started, describe_error(exc))
                if is_lasting(exc):
                    lasting.add(key)
                continue
            low = getattr(answer, "low_watermark", None)
            if not isinstance(low, int):
                outcome[key] = (None, f"unexpected DeleteRecords answer {answer!r}")
            elif low < wanted[key]:
                outcome[key] = (
                    None,
                    f"broker kept low watermark {low} below the requested offset {wanted[key]}",
                )
            else:
                outcome[key] = (low, None)
        self._serve_logs()
        results = []
        for d in deletions:
            low, error = outcome.get(
                (d.topic, d.partition), (None, "no answer for this partition from the broker")
            )
            if error is None:
                results.append(DeletionResult(d, True, d.bytes, MODE))
            else:
                key = (d.topic, d.partition)
                refused = key in lasting  # LASTING errors are the topic's (``errors``)
                results.append(
                    DeletionResult(d, False, 0, MODE, error, lasting=refused, whole_topic=refused)
                )
        for (topic, partition), (low, error) in outcome.items():
            if error is None:
                log.info("delete_records", topic=topic, partition=partition, low_watermark=low)
            else:
                log.warning("delete_records_failed", topic=topic, partition=partition, error=error)
        return results

    def metadata(self) -> Any:
        """One Metadata round trip; raises what the client raises (``check-config``)."""
        try:
            return self._admin.list_topics(timeout=self.timeout)
        finally:
            self._serve_logs()

    def authorized(self, topics: Sequence[str]) -> Authorized:
        """What this client's principal may do on the cluster and on ``topics`` (KIP-430)."""
        try:
            return authorized_operations(self._admin, topics, self.timeout)
        finally:
            self._serve_logs()

    def acl_error(self) -> str | None:
        """None when the broker answers DescribeAcls (an authorizer is on and we may ask),
        else the error in one line. Changes nothing on the broker."""
        try:
            return describe_acls_error(self._admin, self.timeout)
        finally:
            self._serve_logs()

    # -- broker settings and leadership --------------------------------------------------
    def broker_configs(self, broker_id: int | None) -> dict[str, str | None] | None:
        """This broker's configuration (DescribeConfigs on its BROKER resource), or None.

        Without a known broker id (no ``meta.properties``) the first broker in the metadata
        is asked: retention-check settings are normally the same across a cluster.
        """
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, untyped
            ConfigResource,
            ResourceType,
        )

        started = time.monotonic()
        try:
            self._patience.check()
            if broker_id is None:
                cluster = self._admin.describe_cluster(request_timeout=self.timeout).result(
                    timeout=self.timeout + min(2.0, self.timeout)
                )
                brokers = sorted(node.id for node in cluster.nodes)
                if not brokers:
                    return None
                broker_id = brokers[0]
            resource = ConfigResource(ResourceType.BROKER, str(broker_id))
            describe = getattr(self._admin, "describe_configs", None)
            if describe is None:
                return None
            futures = describe([resource], request_timeout=self.timeout)
            entries = next(iter(futures.values())).result(timeout=self.timeout + 2.0)
            return {key: entry.value for key, entry in entries.items()}
        except Exception as exc:
            error = describe_error(exc)
            self._patience.waited_out(started, error)
            log.warning("broker_configs_unavailable", broker_id=broker_id, error=error)
            return None
        finally:
            self._serve_logs()

    def leaders(self, topics: Iterable[str]) -> dict[tuple[str, int], int]:
        """``(topic, partition) -> leader broker id`` (``placement``; {} on error)."""
        return {tp: lead for tp, (lead, _r) in self.placement(topics).items() if lead >= 0}

    def placement(self, topics: Iterable[str]) -> Placement:
        """Leader and replicas of each partition of ``topics`` from one Metadata request for
        ``topics`` only (DescribeTopics): its answer grows with the topics a plan chose, not
        with every partition of the cluster. A topic the broker does not answer for is left
        out (no preference there); {} with a warning when nothing could be asked."""
        return self.placement_soon(topics)()

    def placement_soon(self, topics: Iterable[str]) -> Callable[..., Placement]:
        """``placement``'s request sent now; the function returned waits for its answer
        (given topics, for those only: as if only they had been asked). A one-shot plan sends
        it before its scan, for every topic on its disks, so that no round trip waits after
        its walk. If a request of this cycle waited out the timeout meanwhile, the answer is
        given up as ``placement`` would not have asked (``OneTimeout``)."""
        wanted = sorted(set(topics))
        out: Placement = {}
        if not wanted:
            return lambda _topics=None: out
        from confluent_kafka import TopicCollection

        started = time.monotonic()
        futures: Mapping[str, concurrent.futures.Future[Any]] = {}
        try:
            self._patience.check()
            futures = self._admin.describe_topics(
                TopicCollection(wanted), request_timeout=self.timeout
            )
        except Exception as exc:
            error = describe_error(exc)
            self._patience.waited_out(started, error)
            return lambda _topics=None: self._no_placement(error)

        def answer(only: Iterable[str] | None = None) -> Placement:
            if only is None:
                return self._placement(futures, started)
            keep = set(only)
            return self._placement({t: f for t, f in futures.items() if t in keep}, started)

        return answer

    def _no_placement(self, error: str) -> Placement:
        log.warning("metadata_unavailable", error=error)
        self._serve_logs()
        return {}

    def _placement(
        self, futures: Mapping[str, concurrent.futures.Future[Any]], started: float
    ) -> Placement:
        try:
            self._patience.check()
        except Exception as exc:
            return self._no_placement(describe_error(exc))
        out: Placement = {}
        deadline = time.monotonic() + self.timeout + min(2.0, self.timeout)
        for name, future in futures.items():
            try:
                described = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:  # that topic has no preference (as a topic error had)
                self._patience.waited_out(started, describe_error(exc))
                continue
            for part in getattr(described, "partitions", None) or []:
                leader = getattr(getattr(part, "leader", None), "id", -1)
                replicas = tuple(
                    int(r.id) for r in getattr(part, "replicas", None) or () if r is not None
                )
                lead = leader if isinstance(leader, int) else -1
                out[(str(name), int(part.id))] = (lead, replicas)
        self._serve_logs()
        return out

    def log_start_offsets_soon(self, partitions: Iterable[tuple[str, int]]) -> AskedLogStart:
        """``log_start_offsets``' request for ``partitions`` sent now; its answer is taken by
        a later ``log_start_offsets(..., asked)`` (a one-shot plan overlaps the round trip
        with its walk)."""
        started = time.monotonic()
        try:
            self._patience.check()
            return AskedLogStart(
                started, ask_log_start_offsets(self._admin, partitions, self.timeout)
            )
        except Exception as exc:
            return AskedLogStart(started, {}, exc)

    def log_start_offsets(
        self, partitions: Iterable[tuple[str, int]], asked: AskedLogStart | None = None
    ) -> dict[tuple[str, int], int]:
        """The log start offset each partition's leader reports ({} on error). ``asked``:
        the request sent earlier (``log_start_offsets_soon``): its answers for
        ``partitions`` (any it did not ask for are asked now)."""
        wanted = set(partitions)
        started = time.monotonic() if asked is None else asked.started
        try:
            if asked is None:
                self._patience.check()
                return log_start_offsets(self._admin, wanted, self.timeout)
            if asked.error is not None:
                raise asked.error
            futures = {k: f for k, f in asked.futures.items() if k in wanted}
            missing = wanted - futures.keys()
            if missing:
                self._patience.check()
                futures.update(ask_log_start_offsets(self._admin, missing, self.timeout))
            return log_start_offsets_of(futures, self.timeout)
        except Exception as exc:
            error = describe_error(exc)
            self._patience.waited_out(started, error)
            log.warning("metadata_unavailable", error=error)
            return {}
        finally:
            self._serve_logs()

    # -- consumer offsets ----------------------------------------------------------------
    def committed_offsets(self, topics: Iterable[str]) -> dict[tuple[str, int], dict[str, int]]:
        """``(topic, partition) -> {group: committed offset}`` for ``topics``, across every
        consumer group; ``NO_OFFSET`` where a group consumes the topic (has committed on some
        partition of it) but not on this partition. Errors give what could be read (possibly
        ``{}``) plus a warning: the planner then just cannot prefer consumed segments."""
        wanted = set(topics)
        if not wanted:
            return {}
        return self.committed_offsets_soon()(wanted)

    def committed_offsets_soon(self) -> AskedOffsets:
        """``committed_offsets``' requests sent from now on (ListGroups now, each group's
        OffsetFetch once it answered: ``AskedOffsets.advance``); calling the object returned
        with the topics takes the answer. A one-shot plan sends them before it scans, so
        that its walk does not wait for two round trips after it. What went wrong is said
        (logged) when the answer is taken, as ``committed_offsets`` says it."""
        started = time.monotonic()
        try:
            self._patience.check()
            listing = self._admin.list_consumer_groups(request_timeout=self.timeout)
        except Exception as exc:
            return AskedOffsets(self, started, None, exc)
        return AskedOffsets(self, started, listing)

    def _offsets_sent(
        self, listing: Any
    ) -> tuple[list[Any], dict[str, concurrent.futures.Future[Any]], list[tuple[str, str]]]:
        """Each group's OffsetFetch sent, for ListGroups' answer ``listing``: the listing's
        errors, the futures and the groups that could not be asked (with why)."""
        errors = list(getattr(listing, "errors", None) or [])
        groups = sorted({g.group_id for g in getattr(listing, "valid", None) or []})
        from confluent_kafka import ConsumerGroupTopicPartitions

        futures: dict[str, concurrent.futures.Future[Any]] = {}
        unsent: list[tuple[str, str]] = []
        for group in groups:
            # The API takes one group per request.
            try:
                futures.update(
                    self._admin.list_consumer_group_offsets(
                        [ConsumerGroupTopicPartitions(group)], request_timeout=self.timeout
                    )
                )
            except Exception as exc:
                unsent.append((group, describe_error(exc)))
        return errors, futures, unsent

    # -- topic configs -------------------------------------------------------------------
    def describe_topic_configs(
        self, topics: Sequence[str], keys: Sequence[str] = TOPIC_POLICY_KEYS
    ) -> dict[str, dict[str, str | None]]:
        """``topic -> {key: value}`` (only ``keys`` the broker returned) for every topic the
        broker answered for. A topic it could not answer for is left out, so its policy stays
        unknown (and protected); one warning names them. Never raises."""
        return self.describe_topic_configs_soon(topics, keys)()

    def describe_topic_configs_soon(
        self, topics: Sequence[str], keys: Sequence[str] = TOPIC_POLICY_KEYS
    ) -> Callable[[], dict[str, dict[str, str | None]]]:
        """``describe_topic_configs``' request sent now; the function returned waits for
        its answer (a one-shot plan overlaps the round trip with the broker's settings)."""
        out: dict[str, dict[str, str | None]] = {}
        if not topics:
            return lambda: out
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported
            ConfigResource,
            ResourceType,
        )

        failed: dict[str, str] = {}
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in sorted(set(topics))]
        started = time.monotonic()
        futures: Mapping[Any, concurrent.futures.Future[Any]] = {}
        try:
            self._patience.check()
            futures = self._admin.describe_configs(resources, request_timeout=self.timeout)
        except Exception as exc:
            failed = {r.name: describe_error(exc) for r in resources}
        return lambda: self._topic_configs(resources, futures, failed, started, keys)

    def _topic_configs(
        self,
        resources: Sequence[Any],
        futures: Mapping[Any, concurrent.futures.Future[Any]],
        failed: dict[str, str],
        started: float,
        keys: Sequence[str],
    ) -> dict[str, dict[str, str | None]]:
        out: dict[str, dict[str, str | None]] = {}
        deadline = time.monotonic() + self.timeout + min(2.0, self.timeout)
        for resource, future in futures.items():
            name = str(getattr(resource, "name", resource))
            try:
                entries = future.result(timeout=max(0.0, deadline - time.monotonic()))
                out[name] = {
                    key: (None if entry.value is None else str(entry.value))
                    for key, entry in dict(entries).items()
                    if key in keys
                }
            except Exception as exc:  # one topic's failure must not hide the others
                failed[name] = describe_error(exc)
                self._patience.waited_out(started, failed[name])
        for resource in resources:
            if resource.name not in out and resource.name not in failed:
                failed[resource.name] = "no answer for this topic from the broker"
        self._serve_logs()
        if failed:
            first = next(iter(sorted(failed.items())))
            log.warning(
                "topic_configs_unavailable",
                topics=sorted(failed),
                error=first[1],
                consequence="cleanup.policy unknown: these topics stay protected",
            )
        return out


class AskedLogStart:
    """A ListOffsets EARLIEST sent (``BrokerClient.log_start_offsets_soon``): when, each
    partition's answer to come, or why it could not be sent. (A plain class: a dataclass
    costs a broker-mode command's start-up ~0.6 ms to make.)"""

    __slots__ = ("error", "futures", "started")

    def __init__(
        self,
        started: float,
        futures: Mapping[tuple[str, int], concurrent.futures.Future[Any]],
        error: Exception | None = None,
    ) -> None:
        self.started = started
        self.futures = futures
        self.error = error


class AskedOffsets:
    """The consumer groups' committed offsets asked (``BrokerClient.committed_offsets_soon``):
    ListGroups sent, then each group's OffsetFetch (``advance``: as soon as ListGroups has
    answered, without waiting; else when taken). Calling it with the topics wanted waits for
    the rest, within one client timeout from the first request, and logs what failed."""

    def __init__(
        self,
        client: BrokerClient,
        started: float,
        listing: concurrent.futures.Future[Any] | None,
        error: Exception | None = None,
    ) -> None:
        self._client = client
        self._started = started
        self._listing = listing
        self._error = error
        self._sent: (
            tuple[list[Any], dict[str, concurrent.futures.Future[Any]], list[tuple[str, str]]]
            | None
        ) = None

    def _deadline(self) -> float:
        timeout = self._client.timeout
        return self._started + timeout + min(2.0, timeout)

    def advance(self) -> None:
        """Each group's OffsetFetch sent now if ListGroups has answered (never waits)."""
        listing = self._listing
        if self._sent is not None or listing is None or not listing.done():
            return
        try:
            self._client.patience.check()
        except BrokerHung:
            return  # taken, it says so (as ``committed_offsets`` would have)
        if listing.exception() is None:
            self._sent = self._client._offsets_sent(listing.result())

    def __call__(self, topics: Iterable[str]) -> dict[tuple[str, int], dict[str, int]]:
        client = self._client
        patience = client.patience
        wanted = set(topics)
        out: dict[tuple[str, int], dict[str, int]] = {}
        try:
            # A request since they were sent waited out the timeout: nothing more is asked.
            patience.check()
        except BrokerHung as exc:
            log.warning("consumer_groups_unavailable", error=describe_error(exc))
            return out
        try:
            if self._error is not None:
                raise self._error
            assert self._listing is not None
            listing = self._listing.result(timeout=max(0.0, self._deadline() - time.monotonic()))
        except Exception as exc:
            error = describe_error(exc)
            patience.waited_out(self._started, error)
            log.warning("consumer_groups_unavailable", error=error)
            return out
        if self._sent is None:
            self._sent = client._offsets_sent(listing)
        errors, futures, unsent = self._sent
        for err in errors:
            # A listing cut short by the timeout comes back partial, not raised: it waited
            # the timeout out all the same, and the cycle's later calls would too.
            patience.waited_out(self._started, describe_error(err))
            log.warning("consumer_groups_partial", error=describe_error(err))
        for group, error in unsent:
            log.warning("consumer_offsets_unavailable", group=group, error=error)
        for group, future in futures.items():
            try:
                answer = future.result(timeout=max(0.0, self._deadline() - time.monotonic()))
            except Exception as exc:
                patience.waited_out(self._started, describe_error(exc))
                log.warning("consumer_offsets_unavailable", group=group, error=describe_error(exc))
                continue
            for key, offset in _group_offsets(answer, wanted).items():
                out.setdefault(key, {})[group] = offset
        client._serve_logs()
        return out


def _group_offsets(answer: Any, wanted: set[str]) -> dict[tuple[str, int], int]:
    """One group's OffsetFetch answer for the ``wanted`` topics.

    A partition without a commit (offset -1001 / -1) is kept as ``NO_OFFSET`` when the group
    has committed on another partition of that topic: it consumes the topic and has read
    nothing there, which is not the same as having read everything. A topic the group has no
    commit on at all is left out (the group does not consume it).
    """
    by_topic: dict[str, dict[int, int]] = {}
    for tp in getattr(answer, "topic_partitions", None) or []:
        if tp.topic in wanted and tp.error is None:
            by_topic.setdefault(tp.topic, {})[tp.partition] = max(tp.offset, NO_OFFSET)
    return {
        (topic, partition): offset
        for topic, offsets in by_topic.items()
        if any(o >= 0 for o in offsets.values())
        for partition, offset in offsets.items()
    }
