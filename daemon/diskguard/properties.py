"""Java ``.properties`` syntax, pure text in, properties out: one reader for the broker's own
files (``kafkalog.serverprops``: ``server.properties``, ``meta.properties``) and for the
client settings Kafka's tools take as ``--command-config`` (``fleet.kafkasource``).

A leaf (imports nothing of diskguard), so that both layers may use it: each does its own
I/O and its own checks on what this returns.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = ["parse_properties"]

#: A key (no separator nor blank in it), then ``=``, ``:`` or blanks, then the value.
_PROPERTY = re.compile(r"^([^=:\s]+)\s*[=:\s]\s*(.*)$")


def parse_properties(text: str) -> Iterator[tuple[int, str, str | None]]:
    """``(line number, key, value)`` per property, in order: ``key=value``, ``key: value`` or
    ``key value``; ``#`` / ``!`` comment lines and blank lines skipped; a line ending in ``\\``
    continues on the next (its number is the first line's). A line that is only a key (or
    starts with a separator) gives the whole line as the key and None for the value: Java
    reads it as an empty value, a reader that wants ``key=value`` says it is malformed."""
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip()
        if not pending:
            start = number
        pending = ""
        if not line or line.startswith(("#", "!")):
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        match = _PROPERTY.match(line)
        if match:
            yield start, match.group(1), match.group(2).strip()
        else:
            yield start, line, None
