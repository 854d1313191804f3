"""A progress bar for long interactive commands, and silence everywhere else (edge).

A full scan of a large log dir or an offline rescue can take minutes; a person at a terminal
should see it move. Under systemd, in a pipe or in CI, escape-code animation would only
pollute the journal and captured output, so the same call becomes a no-op there.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["progress"]


def _noop(n: float = 1) -> None:
    return None


@contextmanager
def progress(
    total: float | None, description: str, stream: TextIO | None = None
) -> Iterator[Callable[[float], None]]:
    """``with progress(n, "scanning") as advance: ... advance(1)``; a bar only on a TTY.

    ``total=None`` shows an indeterminate bar. The bar goes to stderr so stdout (``--json``)
    stays machine-readable.
    """
    out = sys.stderr if stream is None else stream
    if not out.isatty():
        yield _noop
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(file=out),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: float = 1) -> None:
            bar.advance(task, n)

        yield advance
