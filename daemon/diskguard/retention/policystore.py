"""Where topic policies come from, and the durable cache of them (edge).

The truth about a topic's ``cleanup.policy`` and ``remote.storage.enable`` is the broker's.
In broker mode it is asked (DescribeConfigs): topics not known yet at once, every topic every
``FULL_REFRESH_S``. Each answer is kept in ``<state_dir>/topic-policies.json`` (written
crash-safely), because the moment diskguard most needs it — the broker died with a full disk
— is exactly when nobody can be asked. Offline, the cache is used, and a KRaft log dir's own
metadata log (``kraftmeta``) is read as well: it is the broker's final word, so it wins over
the cache there; in broker mode the broker's fresh answer wins.

What is not known stays unknown: the rule (``topicpolicy``) then protects the topic.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from diskguard.host.atomicfile import write_json_atomic
from diskguard.kafkalog import kraftmeta
from diskguard.kafkalog.serverprops import read_properties
from diskguard.kafkalog.topicpolicy import (
    SOURCE_BROKER,
    KraftTopics,
    ProtectionRule,
    TopicPolicy,
    is_internal,
    normalize_policy,
    policies_from_json,
    policies_to_json,
)
from diskguard.logs import get_logger

__all__ = ["CACHE_FILE", "ConfigSource", "PolicyStore"]

CACHE_FILE = "topic-policies.json"
#: Every topic's policy is asked again this often (a topic's policy can be altered).
FULL_REFRESH_S = 300.0
#: A topic the broker could not answer for is asked again after this long.
RETRY_UNKNOWN_S = 30.0

log = get_logger("diskguard.topicpolicy")


class ConfigSource(Protocol):
    """``BrokerClient.describe_topic_configs``: answered topics only, never raises."""

    def describe_topic_configs(
        self, topics: Sequence[str]
    ) -> Mapping[str, Mapping[str, str | None]]: ...


class PolicyStore:
    """Known topic policies: the cache file, the broker refresh and the KRaft metadata."""

    def __init__(
        self,
        path: Path,
        persist: bool = True,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.persist = persist
        self._wall_ms = wall_ms
        self._monotonic = monotonic
        self._asked: dict[str, float] = {}
        self._last_full: float | None = None
        self._kraft: dict[str, tuple[object, kraftmeta.KraftMetadata | None]] = {}
        #: Problems not reported yet (a bad cache file, an unreadable metadata log); the
        #: scan hands them on once.
        self.pending_warnings: list[str] = []
        self._policies = self._load()

    def _load(self) -> dict[str, TopicPolicy]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return policies_from_json(data)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self.pending_warnings.append(
                f"{self.path}: topic policy cache unreadable ({exc}); every topic's policy "
                "is unknown until the broker answers"
            )
            return {}

    @property
    def policies(self) -> Mapping[str, TopicPolicy]:
        return self._policies

    # -- broker refresh ------------------------------------------------------------------
    def due(self, topics: Iterable[str]) -> tuple[list[str], bool]:
        """Topics to ask the broker about now, and whether that is a full refresh.

        Internal topics are always protected: never asked.
        """
        wanted = sorted({t for t in topics if not is_internal(t)})
        now = self._monotonic()
        if self._last_full is None or now - self._last_full >= FULL_REFRESH_S:
            return wanted, True
        return [
            t
            for t in wanted
            if t not in self._policies
            and now - self._asked.get(t, float("-inf")) >= RETRY_UNKNOWN_S
        ], False

    def refresh(
        self, source: ConfigSource, topics: Iterable[str], static_default: str | None = None
    ) -> bool:
        """Ask ``source`` about the topics that are due; True when a policy changed.

        A key missing from an answer (brokers such as tansu return only explicitly set
        configs) means no override: ``cleanup.policy`` is then the broker default from
        server.properties (``static_default``) or stays unknown; ``remote.storage.enable``
        is false (brokers before tiered storage do not have the key).
        """
        asked, full = self.due(topics)
        if not asked:
            if full:
                self._last_full = self._monotonic()
            return False
        answers = source.describe_topic_configs(asked)
        now = self._monotonic()
        for topic in asked:
            self._asked[topic] = now
        if full:
            self._last_full = now
        learned = self._wall_ms()
        changed = False
        for topic, values in answers.items():
            raw = values.get("cleanup.policy")
            policy = normalize_policy(static_default if raw is None else raw)
            if policy is None:
                continue
            remote = (values.get("remote.storage.enable") or "false").strip().lower() == "true"
            before = self._policies.get(topic)
            self._policies[topic] = TopicPolicy(policy, remote, learned, SOURCE_BROKER)
            if before is None or (before.cleanup_policy, before.remote_storage_enable) != (
                policy,
                remote,
            ):
                changed = True
                log.info("topic_policy_learned", topic=topic, cleanup_policy=policy, tiered=remote)
        if answers:
            self._save()
        return changed

    def _save(self) -> None:
        if not self.persist:
            return
        try:
            write_json_atomic(self.path, policies_to_json(self._policies))
        except OSError as exc:
            # The answers still hold in memory; only a restart without a broker loses them.
            log.warning(
                "topic_policy_cache_write_failed", path=str(self.path), error=exc.strerror or exc
            )

    # -- the rule ------------------------------------------------------------------------
    def _metadata(self, log_dir: str) -> kraftmeta.KraftMetadata | None:
        """The KRaft metadata of ``log_dir``, re-read only when its files changed."""
        ident: object
        try:
            ident = kraftmeta.identity(log_dir)
        except OSError as exc:
            ident = ("error", str(exc))
        cached = self._kraft.get(log_dir)
        if cached is not None and cached[0] == ident:
            return cached[1]
        meta: kraftmeta.KraftMetadata | None
        try:
            meta = kraftmeta.read_metadata(log_dir) if ident is not None else None
        except OSError as exc:
            meta = None
            self.pending_warnings.append(
                f"{os.path.join(log_dir, kraftmeta.METADATA_DIR)}: unreadable "
                f"({exc.strerror or exc}); topic policies not read from it"
            )
        if meta is not None and not meta.complete:
            self.pending_warnings.append(
                f"KRaft metadata read incompletely ({meta.problem}); it only adds protection"
            )
        self._kraft[log_dir] = (ident, meta)
        return meta

    def rule(
        self,
        protect_topics: Sequence[str],
        assume_delete_policy: Sequence[str],
        log_dirs: Sequence[str],
        offline: bool,
        static_default: str | None = None,
        node_id: int | None = None,
        read_kraft: bool = True,
        delete_tiered: Sequence[str] = (),
    ) -> ProtectionRule:
        """The protection rule from the config and everything known now.

        KRaft metadata wins over the cache offline (nothing can have changed since the broker
        stopped writing it); otherwise the cache holds the broker's fresh answers and the
        metadata only fills gaps. ``read_kraft`` False skips it: under a running broker the
        metadata log changes every half second (NoOpRecords) and would be re-read each scan
        for nothing the broker cannot say itself.
        """
        policies = dict(self._policies)
        learned = self._wall_ms()
        metas: list[kraftmeta.KraftMetadata] = []
        for log_dir in log_dirs if read_kraft else ():
            meta = self._metadata(log_dir)
            if meta is None:
                continue
            metas.append(meta)
            for topic in sorted(meta.topics | set(meta.topic_configs)):
                found = kraftmeta.topic_policy(meta, topic, static_default, node_id, learned)
                if found is None:
                    continue
                prev = policies.get(topic)
                if prev is None or (offline and found.cleanup_policy is not None):
                    policies[topic] = found
                elif found.remote_storage_enable and not prev.remote_storage_enable:
                    # Only adds protection, whatever the mode.
                    policies[topic] = replace(prev, remote_storage_enable=True, source=found.source)
        # One broker's complete metadata says which partition dirs it will set aside as
        # strays; metadata from two (two brokers' dirs guarded together) says nothing sure.
        only = metas[0] if len(metas) == 1 and metas[0].complete else None
        return ProtectionRule(
            protect_topics=tuple(protect_topics),
            assume_delete_policy=tuple(assume_delete_policy),
            policies=policies,
            kraft=bool(metas) or (read_kraft and _kraft_formatted(log_dirs)),
            kraft_topics=None if only is None else KraftTopics(only.topic_ids, only.removed_topics),
            delete_tiered=tuple(delete_tiered),
        )

    def take_warnings(self) -> list[str]:
        out, self.pending_warnings = self.pending_warnings, []
        return out


def _kraft_formatted(log_dirs: Sequence[str]) -> bool:
    """A log dir formatted for KRaft (``meta.properties`` ``version=1``; a ZooKeeper-mode
    broker writes 0), whether or not the metadata log is among the guarded dirs."""
    for log_dir in log_dirs:
        try:
            props = read_properties(Path(log_dir) / "meta.properties")
        except OSError:
            continue
        if props.get("version", "").strip() == "1":
            return True
    return False
