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


def get_logger(name: str | None = None) -> Any:
    """A lazy structlog logger; ``name`` becomes the ``component`` key.

    Lazy matters: modules create their logger at import time, before ``configure_logging``
    runs; binding eagerly would freeze structlog's default (console) config into it. The key
    is not ``logger`` because that is ``wrap_logger``'s own first parameter.
    """
    return structlog.get_logger(component=name) if name else structlog.get_logger()
