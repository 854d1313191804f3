"""Kafka's offset checkpoint files in a log dir, read-only (``OffsetCheckpointFile``).

``log-start-offset-checkpoint`` says which segments are below a partition's log start (pending
reclaim); ``cleaner-offset-checkpoint`` lists the partitions the log cleaner compacts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from diskguard.host import safeopen

LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
#: Compiled once: in broker mode every retention cycle reads the log start checkpoint, a line
#: per partition, and ``re.fullmatch(pattern, ...)`` looks its pattern up on every line.
_OFFSET = re.compile(r"-?\d+")


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Kafka's ``OffsetCheckpointFile``: version 0, a count, then ``topic partition offset``.

    A missing or empty file is normal (a broker creates ``cleaner-offset-checkpoint`` empty at
    start-up and leaves it so until the first compaction); a malformed one raises ValueError
    naming it, and one that is not a regular file (a FIFO would block the reader forever) an
    OSError naming it.
    """
    try:
        text = safeopen.read_text(path)
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if not text:
        return {}
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != "0" or not lines[1].strip().isdigit():
        raise ValueError(f"{path}: malformed checkpoint header")
    count = int(lines[1])
    out: dict[tuple[str, int], int] = {}
    offset = _OFFSET.fullmatch
    for line in lines[2 : 2 + count]:
        parts = line.split()
        if len(parts) != 3 or not parts[1].isdigit() or not offset(parts[2]):
            raise ValueError(f"{path}: malformed checkpoint line {line!r}")
        out[(parts[0], int(parts[1]))] = int(parts[2])
    if len(out) != count:
        raise ValueError(f"{path}: checkpoint says {count} entries, has {len(out)}")
    return out


def compacted_topics(log_dirs: Iterable[str]) -> tuple[frozenset[str], list[str]]:
    """Topics any log dir's ``cleaner-offset-checkpoint`` lists, plus warnings.

    A partition's topic may be cleaned in another log dir (JBOD): the cleaner only lists the
    partitions it holds, but the policy is the topic's, so every dir's checkpoint counts.
    """
    topics: set[str] = set()
    warnings: list[str] = []
    for log_dir in log_dirs:
        try:
            topics.update(tp[0] for tp in read_checkpoint(Path(log_dir) / CLEANER_CHECKPOINT))
        except (ValueError, OSError) as exc:
            warnings.append(f"{exc}; compacted topics unknown from the cleaner checkpoint")
    return frozenset(topics), warnings
