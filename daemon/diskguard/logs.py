"""Structured logging: one JSON object per line on stdout, key ``event``.

systemd's journal keeps stdout lines as they are, so JSON lines are both machine-readable
(jq, Loki, Splunk) and greppable. ``console`` is for a person at a terminal.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(fmt: str = "json", level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog once per process; safe to call again (e.g. after a config reload)."""
    out = stream if stream is not None else sys.stdout
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
    _bridge_stdlib_logging(level)


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
        getattr(structlog.get_logger(component="library"), method)(
            "library_log", logger=record.name, message=message
        )


_BRIDGE = _LibraryLogBridge()


def _bridge_stdlib_logging(level: str) -> None:
    root = logging.getLogger()
    if _BRIDGE not in root.handlers:
        root.addHandler(_BRIDGE)
    # Libraries log at their own pace; only what would matter to an operator gets through.
    root.setLevel(max(_LEVELS[level], logging.WARNING))


def get_logger(name: str | None = None) -> Any:
    """A lazy structlog logger; ``name`` becomes the ``component`` key.

    Lazy matters: modules create their logger at import time, before ``configure_logging``
    runs; binding eagerly would freeze structlog's default (console) config into it. The key
    is not ``logger`` because that is ``wrap_logger``'s own first parameter.
    """
    return structlog.get_logger(component=name) if name else structlog.get_logger()
