"""A consumer group's offsets committed the way an application's client does it: retrying
what the broker says to retry (test helper)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition


def commit_offsets(
    consumer: Consumer, offsets: Sequence[TopicPartition], timeout: float = 60.0
) -> None:
    """``offsets`` committed for ``consumer``'s group. A broker that has just started loads
    its group coordinator for a while (``COORDINATOR_LOAD_IN_PROGRESS``, retriable): an
    application retries that, and so does a test that sets a group up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            consumer.commit(offsets=list(offsets), asynchronous=False)
            return
        except KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
