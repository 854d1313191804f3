"""kafka-python, where confluent-kafka has no API: one translation of ``[broker.client]`` and
one lazily connected admin client (edge).

confluent-kafka (librdkafka) is diskguard's Kafka client. It has no client-quota API
(DescribeClientQuotas / AlterClientQuotas: the ``quota`` actuator), no DescribeLogDirs or
AlterReplicaLogDirs (moving replicas between a broker's JBOD log dirs) and no ListOffsets
``LATEST_TIERED`` (how far tiered storage has uploaded, KIP-1005): kafka-python 3 has all of
them. ``[broker.client]`` holds librdkafka settings; ``client_options`` is the one place they
are translated for kafka-python.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["ClientOptions", "KafkaPythonAdmin", "KafkaPythonUnavailable", "client_options"]

#: ``[broker.client]`` keys (librdkafka's names) -> the ``KafkaAdminClient`` keyword that
#: means the same. Every other key is left out (``ClientOptions.ignored`` says why).
_TRANSLATED: Final = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "client.id": "client_id",
}
#: Left-out keys that may decide whether a secured broker lets the client in.
_SECURITY_PREFIXES: Final = ("security.", "sasl.", "ssl.")


class KafkaPythonUnavailable(Exception):
    """The kafka-python client could not be made (no bootstrap, a refused connection); the
    text says why, naming the ``[broker.client]`` keys it did not get."""


@dataclass(frozen=True)
class ClientOptions:
    """``KafkaAdminClient`` keywords, and the ``[broker.client]`` keys left out with why."""

    kwargs: Mapping[str, Any]
    ignored: Mapping[str, str]

    def unsent_security_keys(self) -> list[str]:
        return sorted(k for k in self.ignored if k.startswith(_SECURITY_PREFIXES))


def client_options(
    bootstrap: str | None,
    client: Mapping[str, str | int | float | bool],
    timeout_ms: int,
    purpose: str = "the kafka-python client's calls",
) -> ClientOptions:
    """The one translation of the broker settings for kafka-python."""
    kwargs: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_id": "diskguard",
        "request_timeout_ms": timeout_ms,
        "bootstrap_timeout_ms": timeout_ms,
    }
    ignored: dict[str, str] = {}
    for key, value in client.items():
        if key in _TRANSLATED:
            kwargs[_TRANSLATED[key]] = value
        elif key.startswith(_SECURITY_PREFIXES):
            ignored[key] = (
                "no kafka-python equivalent is translated: the client connects without "
                "it (a secured broker may refuse it; the failure names the key)"
            )
        else:
            ignored[key] = f"librdkafka tuning with no part in {purpose}"
    return ClientOptions(kwargs, ignored)


class KafkaPythonAdmin:
    """One lazily connected kafka-python admin client, dropped after any failure.

    Connecting lazily keeps a daemon with no reachable broker starting (its calls fail
    loudly, then retry); dropping the client after a failure means the retry reconnects
    rather than reusing a connection in an unknown state.
    """

    def __init__(
        self,
        bootstrap: str | None,
        client: Mapping[str, str | int | float | bool],
        timeout_s: float = 10.0,
        purpose: str = "the kafka-python client's calls",
    ) -> None:
        self._bootstrap = bootstrap
        self._client = dict(client)
        self._timeout_ms = int(timeout_s * 1000)
        self._purpose = purpose
        self._admin: Any = None
        self._lock = threading.Lock()

    @property
    def bootstrap(self) -> str | None:
        return self._bootstrap

    @property
    def client(self) -> dict[str, str | int | float | bool]:
        """The ``[broker.client]`` settings it was given (before translation)."""
        return dict(self._client)

    def admin(self) -> Any:
        """The connected ``KafkaAdminClient``; raises ``KafkaPythonUnavailable`` (no bootstrap,
        or a refusal that may be a left-out security key), else what the client raised."""
        with self._lock:
            if self._admin is None:
                if not self._bootstrap:
                    raise KafkaPythonUnavailable("broker.bootstrap_servers is not set")
                from kafka.admin import KafkaAdminClient

                # SASL/PLAIN without TLS is the operator's choice, made in the config: not a
                # warning (a JSON library_log line) at every connection.
                logging.getLogger("kafka.net.sasl.plain").setLevel(logging.ERROR)

                options = client_options(
                    self._bootstrap, self._client, self._timeout_ms, self._purpose
                )
                try:
                    self._admin = KafkaAdminClient(**options.kwargs)
                except Exception as exc:
                    unsent = options.unsent_security_keys()
                    if not unsent:
                        raise
                    # Say what the other clients have that this one did not get.
                    name, text = type(exc).__name__, str(exc)
                    detail = text if text.startswith(name) else f"{name}: {text}"
                    raise KafkaPythonUnavailable(
                        f"{detail} ([broker.client] {', '.join(unsent)} "
                        "not passed to kafka-python: no equivalent)"
                    ) from exc
            return self._admin

    def send(self, request: Any) -> Any:
        """Send one kafka-python request to the least loaded broker; its response.

        A broker that refuses the connection (killed, restarting: one of three) is not the
        cluster: the request goes to the next broker the metadata names, each tried once,
        and only when none answers is the connection error raised. Only a failure to reach
        a broker moves on (the request never left, or the connection died under it: the
        calls sent this way are reads and idempotent writes); any answer is the answer."""
        from kafka.errors import KafkaConnectionError, NodeNotReadyError

        admin = self.admin()
        manager = admin._manager
        tried: set[Any] = set()
        while True:
            node = manager.run(_next_node, manager, frozenset(tried))
            try:
                # The same call kafka-python's own admin mixins make (kafka/admin/_acls.py).
                return manager.run(manager.send, request, node)
            except (KafkaConnectionError, NodeNotReadyError):
                if node is None:
                    raise
                tried.add(node)
                if manager.run(_next_node, manager, frozenset(tried)) is None:
                    raise

    def reset(self) -> None:
        """Drop the client (after a failure): the next call reconnects."""
        with self._lock:
            admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()


def _next_node(manager: Any, tried: frozenset[Any]) -> Any:
    """The least loaded broker not tried yet (kafka-python's choice when none was), else any
    broker the metadata names that was not tried; None when every one was. Runs on the
    client's event loop (it reads the client's connection state)."""
    node = manager.least_loaded_node()
    if node is not None and node not in tried:
        return node
    others = sorted(b.node_id for b in manager.cluster.brokers() if b.node_id not in tried)
    return others[0] if others else None
