"""Every event the code can emit is in the event tables of docs/events.md.

An operator alerts on event names (``audit_write_failed``, ``spool_unavailable`` ...); one
that is emitted but not documented might as well not exist. The emitted names are found in
the source (every ``<logger>.<level>("name", ...)`` call with a literal name); the documented
ones are the first cell of the tables in docs/events.md; the README names the ones an
operator alerts on first, and each of those must be one of them.
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


def table_events(text: str) -> set[str]:
    """The event names in the first cell of every table row of ``text``."""
    names: set[str] = set()
    for first_cell in re.findall(r"^\| ([^|]+) \|", text, flags=re.M):
        names.update(re.findall(r"`([a-z][a-z0-9_]*)`", first_cell))
    return names


def documented_events() -> set[str]:
    return table_events((ROOT / "docs" / "events.md").read_text(encoding="utf-8"))


def test_every_emitted_event_is_documented() -> None:
    emitted = emitted_events()
    assert len(emitted) > 40  # the scan itself works
    missing = {name: where for name, where in emitted.items() if name not in documented_events()}
    assert not missing, "events emitted but not in docs/events.md's tables:\n" + "\n".join(
        f"  {name} ({where})" for name, where in sorted(missing.items())
    )


def test_every_documented_event_is_emitted() -> None:
    # Logged under a level chosen at run time: flow transitions, library records, stuck.
    dynamic = {"overfull", "overfull_cleared", "disk_alert", "library_log", "retention_stuck"}
    stale = documented_events() - set(emitted_events()) - dynamic
    assert not stale, f"docs/events.md documents events the code never emits: {sorted(stale)}"


def test_the_events_the_readme_names_exist() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## Daemon events")
    section = text[start : text.index("\n## ", start + 1)]
    named = table_events(section)
    assert len(named) > 10, named
    unknown = named - documented_events()
    assert not unknown, f"README's Daemon events names events docs/events.md does not: {unknown}"
