"""Every event the code can emit is in the README's event tables (issue 13 item 5).

An operator alerts on event names (``audit_write_failed``, ``spool_unavailable`` ...); one
that is emitted but not documented might as well not exist. The emitted names are found in
the source (every ``<logger>.<level>("name", ...)`` call with a literal name); the documented
ones are the first cell of the README's tables under "Daemon events".
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "daemon" / "diskguard"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def emitted_events() -> dict[str, str]:
    """event name -> first place it is emitted (``module.py:line``)."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LEVELS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                continue
            name = node.args[0].value
            if NAME.match(name):
                found.setdefault(name, f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def documented_events() -> set[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## Daemon events")
    end = text.index("\n## ", start + 1)
    section = text[start:end]
    names: set[str] = set()
    for first_cell in re.findall(r"^\| ([^|]+) \|", section, flags=re.M):
        names.update(re.findall(r"`([a-z][a-z0-9_]*)`", first_cell))
    return names


def test_every_emitted_event_is_documented() -> None:
    emitted = emitted_events()
    assert len(emitted) > 40  # the scan itself works
    missing = {name: where for name, where in emitted.items() if name not in documented_events()}
    assert not missing, "events emitted but not in README's 'Daemon events' tables:\n" + "\n".join(
        f"  {name} ({where})" for name, where in sorted(missing.items())
    )


def test_every_documented_event_is_emitted() -> None:
    # Logged under a level chosen at run time: flow transitions, library records, stuck.
    dynamic = {"overfull", "overfull_cleared", "disk_alert", "library_log", "retention_stuck"}
    stale = documented_events() - set(emitted_events()) - dynamic
    assert not stale, f"README documents events the code never emits: {sorted(stale)}"
