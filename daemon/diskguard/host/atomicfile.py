"""Crash-safe small-file writes (state files, cursors): temp file, fsync, rename, fsync dir.

After a kill -9 or power loss the file holds either the old or the new content, never a
torn mix — the rule borg follows for its own state, and the only way a restarted daemon
can trust what it finds in its state dir.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename/create/unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically and (``durable``) durably.

    ``durable=False`` keeps the atomic rename (a reader never sees half a file) but skips
    both fsyncs: for a file that is only a view of a running process, rewritten every few
    seconds, a power loss can cost at most one stale or empty copy that the next write
    replaces, and its readers treat an unreadable one as absent."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def write_json_atomic(path: Path, value: Any, durable: bool = True) -> None:
    write_atomic(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode(), durable)


def read_json(path: Path, default: Any) -> Any:
    """The JSON in ``path``, or ``default`` when it does not exist yet."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default
