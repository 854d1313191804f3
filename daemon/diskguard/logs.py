"""Structured logging: one JSON object per line on stdout, key ``event``.

systemd's journal keeps stdout lines as they are, so JSON lines are both machine-readable
(jq, Loki, Splunk) and greppable. ``console`` is for a person at a terminal.

structlog is imported at the first event, not at import: importing it loads its dev module,
asyncio and rich (~50 ms), which ``plan``/``status``/``check-config`` would pay on every run
although they log nothing unless something goes wrong. Until then
:func:`configure_logging` only records what it was asked for.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import Any, TextIO

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

#: The last configure_logging call not yet applied to structlog (it was not imported yet).
_pending: tuple[str, str, TextIO] | None = None


def configure_logging(
    fmt: str = "json", level: str = "info", stream: TextIO | None = None, eager: bool = False
) -> None:
    """Set up structlog once per process; safe to call again (e.g. after a config reload).

    Applied at once when structlog is already loaded (the daemon, tests) or ``eager`` (an
    event stream such as ``enforce``: its first event must not pay structlog's import in the
    middle of its deletions), else at the first event; the stream is fixed now either way.
    """
    global _pending
    out = stream if stream is not None else sys.stdout
    _pending = (fmt, level, out)
    if eager or "structlog" in sys.modules:
        _structlog()
    _bridge_stdlib_logging(level)


def _structlog() -> ModuleType:
    """structlog, with the pending configuration applied first."""
    global _pending
    import structlog

    if _pending is not None:
        fmt, level, out = _pending
        _pending = None
        _apply(structlog, fmt, level, out)
    return structlog


def _apply(structlog: ModuleType, fmt: str, level: str, out: TextIO) -> None:
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    else:
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


class _LibraryLogBridge(logging.Handler):
    """Libraries' stdlib ``logging`` records (watchdog, py4j, ...) as ``library_log`` events.

    Without it they reach stderr through logging's last-resort handler as plain text (watchdog
    prints "InotifyEmitter.queue_events() called when the thread is inactive" at shutdown), and
    one non-JSON line breaks a log shipper that parses the journal.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a library's bad format string must not kill the daemon
            message = str(record.msg)
        level = record.levelname.lower()
        method = level if level in _LEVELS else "warning"
        getattr(get_logger("library"), method)("library_log", logger=record.name, message=message)


_BRIDGE = _LibraryLogBridge()


def _bridge_stdlib_logging(level: str) -> None:
    root = logging.getLogger()
    if _BRIDGE not in root.handlers:
        root.addHandler(_BRIDGE)
    # Libraries log at their own pace; only what would matter to an operator gets through.
    root.setLevel(max(_LEVELS[level], logging.WARNING))


def _dropped(*_args: Any, **_kw: Any) -> None:
    """An event below the configured level."""


class _Logger:
    """What :func:`get_logger` returns: structlog's logger, looked up at each call.

    Every attribute (``info``, ``warning``, ``bind``, ...) is structlog's, so callers see no
    difference; only the import of structlog waits for the first event.
    """

    __slots__ = ("_component",)

    def __init__(self, component: str | None) -> None:
        self._component = component

    def __getattr__(self, name: str) -> Any:
        pending = _pending
        if pending is not None and name in _LEVELS and _LEVELS[name] < _LEVELS[pending[1]]:
            # Filtered out by the level asked for (as structlog's filtering logger would):
            # an info event of a plan run at "warning" does not import structlog.
            return _dropped
        structlog = _structlog()
        logger = (
            structlog.get_logger(component=self._component)
            if self._component
            else structlog.get_logger()
        )
        return getattr(logger, name)

    def __repr__(self) -> str:
        return f"<diskguard logger component={self._component!r}>"


def get_logger(name: str | None = None) -> Any:
    """A lazy structlog logger; ``name`` becomes the ``component`` key.

    Lazy matters: modules create their logger at import time, before ``configure_logging``
    runs; binding eagerly would freeze structlog's default (console) config into it. The key
    is not ``logger`` because that is ``wrap_logger``'s own first parameter.
    """
    return _Logger(name)
