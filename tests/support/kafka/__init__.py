"""A real Apache Kafka the project runs itself: resolved from Maven Central, run as nobody.

- ``classpath``: ``Release``, ``parse_release``, ``classpath()`` (mvn over ``pom.xml``, cached
  per release), ``from_distribution()`` (a distribution dir's ``libs/``), ``NEWEST``.
- ``node``: ``JavaServer``, one JVM process as ``nobody`` (start, stop, kill -9, pause).
- ``broker``: ``KafkaNode`` (KRaft combined broker+controller, or a ZooKeeper-mode broker),
  ``ZooKeeper``, ``fast_retention``, ``acl_settings``.
- ``cluster``: ``KafkaCluster`` (one or more nodes; node 0 is "the broker"), ``running_cluster``.
- ``target()``: the release, classpath and mode this run tests against (environment below).
- ``python -m support.kafka``: the same as a command for bench/ and the demo (``--help``).

The environment picks the broker: ``DISKGUARD_KAFKA_HOME`` (a distribution dir) wins; else
``DISKGUARD_KAFKA_VERSION`` (``4.4.0``, ``3.9.2``, ``kafka_2.12:2.8.2``; default the newest
4.x) from Maven; ``DISKGUARD_KAFKA_MODE`` ``kraft`` or ``zk`` (default KRaft where the
release has it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from support.kafka.classpath import (
    NEWEST,
    KafkaResolutionError,
    Release,
    classpath,
    from_distribution,
    parse_release,
)

HOME_ENV = "DISKGUARD_KAFKA_HOME"
VERSION_ENV = "DISKGUARD_KAFKA_VERSION"
MODE_ENV = "DISKGUARD_KAFKA_MODE"


@dataclass(frozen=True)
class Target:
    """What a run tests against: a release, its jars, and KRaft or ZooKeeper mode."""

    release: Release
    classpath: tuple[Path, ...]
    mode: str

    def __str__(self) -> str:
        return f"Kafka {self.release.text} ({'KRaft' if self.mode == 'kraft' else 'ZooKeeper'})"


def target(version: str | None = None, mode: str | None = None) -> Target:
    """The broker to test against, from the arguments or the environment; resolution that
    fails raises ``KafkaResolutionError`` (one line)."""
    home = os.environ.get(HOME_ENV, "").strip()
    if home and version is None:
        release, jars = from_distribution(Path(home))
    else:
        text = version or os.environ.get(VERSION_ENV, "").strip()
        release = parse_release(text) if text else NEWEST
        jars = classpath(release)
    chosen = mode or os.environ.get(MODE_ENV, "").strip() or release.modes()[0]
    if chosen not in release.modes():
        raise KafkaResolutionError(
            f"{release} has no {chosen} mode (it has: {', '.join(release.modes())})"
        )
    return Target(release, jars, chosen)


__all__ = ["NEWEST", "KafkaResolutionError", "Release", "Target", "parse_release", "target"]
