"""The daemon's snapshot spool (``STATE_DIR/spool/*.jsonl``) as a test reads it while the
daemon may still be appending: a line without its newline yet is not a record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def spool_lines(state: Path) -> list[str]:
    """Complete (newline-terminated) lines of every spool file, in file order."""
    out: list[str] = []
    for f in sorted((state / "spool").glob("*.jsonl")):
        data = f.read_bytes()
        out.extend(line.decode() for line in data.split(b"\n")[:-1] if line.strip())
    return out


def spooled(state: Path) -> list[dict[str, Any]]:
    """The records of :func:`spool_lines`."""
    return [json.loads(line) for line in spool_lines(state)]
