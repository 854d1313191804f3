"""A broker with tiered storage: Kafka's own ``LocalTieredStorage`` remote storage manager.

``LocalTieredStorage`` (a real ``RemoteStorageManager`` writing to a local dir) ships only in
the storage module's *test* jar (``org.apache.kafka:kafka-storage:<v>:test``, the pom's
``tiered`` profile). Maven Central serves it for 3.9.x, 4.0.0 and 4.3.1 but not for 4.4.0,
and 4.3.1's does not run inside a 4.4.0 broker: measured, the broker exits at start-up with
``NoClassDefFoundError: org/apache/kafka/common/utils/LogContext`` (4.4 moved it). So a run
against 4.4.x tests tiered storage on a 4.3.1 broker entirely (the newest release with the
jar; it also has cordoning, KIP-1066); every other release (3.9+) with its own jar.
"""

from __future__ import annotations

from pathlib import Path

from support.kafka.classpath import KafkaResolutionError, Release, classpath, parse_release

#: The newest release whose storage test jar Maven Central serves.
NEWEST_WITH_TEST_JAR = parse_release("4.3.1")


def tiered_release(target: Release) -> tuple[Release, tuple[Path, ...]] | str:
    """The release and classpath to run a tiered broker as for a run against ``target``, or
    why there is none (a release before 3.9, where tiered storage is not production-ready)."""
    if target.version < (3, 9, 0):
        return f"tiered storage (KIP-405) is production-ready from Kafka 3.9; this run: {target}"
    try:
        return target, classpath(target, ("tiered",))
    except KafkaResolutionError:
        if target.version < NEWEST_WITH_TEST_JAR.version:
            raise
    return NEWEST_WITH_TEST_JAR, classpath(NEWEST_WITH_TEST_JAR, ("tiered",))


def tiered_settings(remote_dir: Path) -> dict[str, str]:
    """Broker settings for tiered storage into ``remote_dir`` (writable by the broker), with
    the RemoteLogManager's tasks every half second (default 30 s) and its metadata topic sized
    for one broker."""
    return {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": (
            "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"
        ),
        # LocalTieredStorage.STORAGE_DIR_CONFIG under the default prefix "rsm.config.".
        "rsm.config.dir": str(remote_dir),
        "remote.log.metadata.manager.listener.name": "PLAINTEXT",
        # TopicBasedRemoteLogMetadataManager's own topic (default RF 3, 50 partitions).
        "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
        "remote.log.manager.task.interval.ms": "500",
    }
