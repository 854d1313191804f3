"""What the broker and librdkafka say, in diskguard's words: a Kafka error as one line with a
hint for the operator, and librdkafka's own log lines as structlog debug events. Shared by the
admin client (``broker.client``) and the snapshot producer (``snapshots.kafkasink``)."""

from __future__ import annotations

import logging

from diskguard.broker.patience import BrokerHung
from diskguard.logs import get_logger

log = get_logger("diskguard.broker")

#: Hints for the answers an operator is most likely to meet.
_HINTS = {
    "UNSUPPORTED_VERSION": "the broker does not support DeleteRecords",
    "_TRANSPORT": "connection to the broker lost (a broker that does not implement "
    "DeleteRecords may drop the connection)",
    "NOT_LEADER_FOR_PARTITION": "this broker is not the partition leader; retried next cycle",
    "TOPIC_AUTHORIZATION_FAILED": "the client lacks DELETE permission on the topic",
    "UNKNOWN_TOPIC_OR_PART": "the broker does not know this topic/partition",
    "REQUEST_TIMED_OUT": "the broker did not answer in time",
    "_TIMED_OUT": "the broker did not answer in time",
}


#: Per-partition DeleteRecords answers that repeat until something outside diskguard changes
#: (an ACL, the topic's cleanup.policy): the cycle sets the partition aside (``setaside``).
#: Both are the topic's, not the partition's (the broker authorizes DeleteRecords on the topic
#: resource; the policy is a topic config), so every partition of the topic is set aside.
#: Everything else (a leader moving, timeouts, a lost connection) may pass: retried next cycle.
LASTING = frozenset({"TOPIC_AUTHORIZATION_FAILED", "POLICY_VIOLATION"})


def is_lasting(exc: BaseException) -> bool:
    """Is ``exc`` a Kafka error in ``LASTING``?"""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0].name() in LASTING
    return False


def describe_error(exc: BaseException) -> str:
    """One line for an admin-call failure: Kafka's error name, its text and a hint."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err = exc.args[0]
        name = err.name()
        hint = _HINTS.get(name)
        text = f"{name}: {err.str()}"
        return f"{text} ({hint})" if hint else text
    if isinstance(exc, BrokerHung):
        return str(exc)
    # concurrent.futures.TimeoutError is this builtin since Python 3.11.
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the broker's answer"
    return f"{type(exc).__name__}: {exc}"


class _StructlogBridge(logging.Handler):
    """librdkafka's own log lines (connection refused, ...) as structlog debug events instead
    of raw ``%3|...`` lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        log.debug("librdkafka", message=record.getMessage(), rdkafka_level=record.levelname)


def rdkafka_logger() -> logging.Logger:
    logger = logging.getLogger("diskguard.librdkafka")
    if not logger.handlers:
        logger.addHandler(_StructlogBridge())
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
    return logger
