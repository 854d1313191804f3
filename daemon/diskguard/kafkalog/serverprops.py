"""The broker's own ``.properties`` files (``server.properties``, ``meta.properties``), read-only.

Java properties syntax, and the few broker settings diskguard takes from ``server.properties``
when its TOML does not say (log dirs, segment sizes).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from diskguard.host import safeopen
from diskguard.properties import parse_properties


@dataclass(frozen=True)
class ServerProperties:
    """The few broker settings diskguard reads from ``server.properties``."""

    log_dirs: tuple[Path, ...]
    segment_bytes: int | None
    segment_index_bytes: int | None
    #: ``metadata.log.dir`` (KRaft), None when unset: then the first of ``log.dirs``.
    metadata_log_dir: Path | None = None


def read_properties(path: Path) -> dict[str, str]:
    """Java ``.properties`` lines: ``key=value``, ``key: value`` or ``key value``, ``#``/``!``
    comments and ``\\`` continuations (``server.properties``, ``meta.properties``).

    Read through ``safeopen``: ``meta.properties`` lives in a log dir, where a FIFO would block
    a plain ``open`` forever; anything but a regular file raises an OSError naming it."""
    text = safeopen.read_text(path, errors="replace")
    return {key: value or "" for _n, key, value in parse_properties(text)}


def local_broker_id(log_dirs: Iterable[Path]) -> int | None:
    """This host's broker id from ``meta.properties`` (``node.id`` in KRaft, else ``broker.id``).

    Here rather than in ``capacity.topicconfigs`` (which still exports it): every retention
    cycle needs it, and that module's import (the reserve report's) cost ``plan`` ~3 ms of
    start-up."""
    for log_dir in log_dirs:
        try:
            props = read_properties(Path(log_dir) / "meta.properties")
        except OSError:
            continue
        for key in ("node.id", "broker.id"):
            value = props.get(key, "").strip()
            if value.lstrip("-").isdigit():
                return int(value)
    return None


def read_server_properties(path: Path) -> ServerProperties:
    """Only ``log.dirs``/``log.dir`` and segment sizes matter here."""
    props = read_properties(path)
    dirs_value = props.get("log.dirs") or props.get("log.dir") or ""
    log_dirs = tuple(Path(d.strip()) for d in dirs_value.split(",") if d.strip())

    def _int(key: str) -> int | None:
        raw = props.get(key)
        return int(raw) if raw is not None and raw.strip().isdigit() else None

    # The broker-level key for a topic's segment.index.bytes is log.index.size.max.bytes.
    index_bytes = _int("log.index.size.max.bytes")
    if index_bytes is None:
        index_bytes = _int("segment.index.bytes")
    metadata = props.get("metadata.log.dir", "").strip()
    return ServerProperties(
        log_dirs, _int("log.segment.bytes"), index_bytes, Path(metadata) if metadata else None
    )


#: The KRaft metadata log's partition dir (``kraftmeta.METADATA_DIR``).
METADATA_PARTITION = "__cluster_metadata-0"


@dataclass(frozen=True)
class MetadataLog:
    """Where a KRaft broker's metadata log lives, and how that is known."""

    #: The dir holding ``__cluster_metadata-0`` (``metadata.log.dir``).
    log_dir: Path
    #: "server.properties metadata.log.dir" or "found in log dir".
    source: str
    #: Whether ``log_dir`` is one of the guarded log dirs (a data disk it shares).
    guarded: bool

    @property
    def path(self) -> Path:
        return self.log_dir / METADATA_PARTITION


def find_metadata_log(
    log_dirs: Iterable[Path], server_properties: Path | None = None
) -> MetadataLog | None:
    """The metadata log of this host's KRaft broker: ``metadata.log.dir`` from
    ``server.properties`` when it says, else the guarded log dir holding
    ``__cluster_metadata-0`` (the default: the first of ``log.dirs``); None when neither
    (a ZooKeeper-mode broker, or a metadata dir diskguard was not told of)."""
    dirs = [Path(d) for d in log_dirs]
    real = {Path(os.path.realpath(d)) for d in dirs}
    if server_properties is not None:
        try:
            configured = read_server_properties(server_properties).metadata_log_dir
        except OSError:
            configured = None
        if configured is not None:
            guarded = Path(os.path.realpath(configured)) in real
            return MetadataLog(configured, "server.properties metadata.log.dir", guarded)
    for log_dir in dirs:
        if (log_dir / METADATA_PARTITION).is_dir():
            return MetadataLog(log_dir, "found in log dir", True)
    return None
