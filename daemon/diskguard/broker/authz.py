"""What diskguard's own principal may do on the cluster and on topics (KIP-430) (edge).

The broker answers DescribeCluster and Metadata with the operations the *asking* principal is
authorized for: exactly what ``check-config --connect`` must say before an overfull night
(may it DeleteRecords the topics of its disks, DescribeConfigs them, create and delete ACLs,
alter client quotas?). Read-only: nothing on the broker changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diskguard.broker.errors import describe_error

__all__ = ["Authorized", "authorized_operations", "client_principal", "describe_acls_error"]


@dataclass(frozen=True)
class Authorized:
    """Operation names (Kafka's: ``DELETE``, ``ALTER``...) the principal may perform."""

    cluster: frozenset[str] | None = None
    topics: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: Why some answer is missing (an older broker, a failed call), else None.
    error: str | None = None

    def topics_without(self, operation: str) -> list[str]:
        return sorted(t for t, ops in self.topics.items() if not _may(ops, operation))

    def cluster_may(self, operation: str) -> bool | None:
        return None if self.cluster is None else _may(self.cluster, operation)


def _may(ops: frozenset[str], operation: str) -> bool:
    return operation in ops or "ALL" in ops


def authorized_operations(admin: Any, topics: Sequence[str], timeout: float) -> Authorized:
    """DescribeCluster and DescribeTopics with ``include_authorized_operations``."""
    from confluent_kafka import TopicCollection

    errors: list[str] = []
    cluster: frozenset[str] | None = None
    try:
        answer = admin.describe_cluster(
            include_authorized_operations=True, request_timeout=timeout
        ).result(timeout=timeout + 2)
        if answer.authorized_operations is not None:
            cluster = frozenset(op.name for op in answer.authorized_operations)
    except Exception as exc:
        errors.append(f"DescribeCluster: {describe_error(exc)}")
    found: dict[str, frozenset[str]] = {}
    if topics:
        try:
            futures = admin.describe_topics(
                TopicCollection(sorted(set(topics))),
                include_authorized_operations=True,
                request_timeout=timeout,
            )
            for name, future in futures.items():
                try:
                    ops = future.result(timeout=timeout + 2).authorized_operations
                except Exception as exc:
                    if "TOPIC_AUTHORIZATION_FAILED" in describe_error(exc):
                        found[name] = frozenset()  # not even DESCRIBE: nothing at all
                    else:
                        errors.append(f"topic {name}: {describe_error(exc)}")
                    continue
                if ops is not None:
                    found[name] = frozenset(op.name for op in ops)
        except Exception as exc:
            errors.append(f"DescribeTopics: {describe_error(exc)}")
    return Authorized(cluster, found, errors[0] if errors else None)


def client_principal(client: Mapping[str, object]) -> str:
    """The principal the broker sees diskguard as, from ``[broker.client]`` (librdkafka's
    settings): a SASL/PLAIN or SCRAM user name is known; other logins say where it comes
    from."""
    protocol = str(client.get("security.protocol", "PLAINTEXT")).upper()
    if protocol.startswith("SASL"):
        mechanism = str(client.get("sasl.mechanism", client.get("sasl.mechanisms", "GSSAPI")))
        user = client.get("sasl.username")
        if mechanism.upper() in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and user:
            return f"User:{user} ({protocol} {mechanism.upper()})"
        return f"the principal of its {protocol} {mechanism.upper()} login"
    if protocol == "SSL":
        return "the principal of its TLS client certificate (SSL)"
    return "User:ANONYMOUS (PLAINTEXT: no authentication)"


def describe_acls_error(admin: Any, timeout: float) -> str | None:
    """None when the broker answers DescribeAcls for every ACL (an authorizer is on and the
    principal may ask), else the error in one line."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, untyped
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    everything = AclBindingFilter(  # None = any name, principal, host
        ResourceType.ANY,
        None,  # type: ignore[arg-type]
        ResourcePatternType.ANY,
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    try:
        admin.describe_acls(everything, request_timeout=timeout).result(timeout=timeout + 2.0)
    except Exception as exc:
        return describe_error(exc)
    return None
