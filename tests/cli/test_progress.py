"""The progress bar draws on a terminal (a real pty) and stays silent in a pipe."""

from __future__ import annotations

import io
import os
import select
import time

from diskguard.progress import progress


def test_silent_when_not_a_tty() -> None:
    out = io.StringIO()
    with progress(3, "scanning", stream=out) as advance:
        for _ in range(3):
            advance(1)
    assert out.getvalue() == ""


def test_draws_on_a_pty() -> None:
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            assert tty.isatty()
            with progress(4, "scanning log dirs", stream=tty) as advance:
                for _ in range(4):
                    advance(1)
            tty.flush()
        drawn = _read_until(master, "scanning log dirs")
    finally:
        os.close(slave)
        os.close(master)
    assert "scanning log dirs" in drawn


def _read_until(fd: int, wanted: str, timeout: float = 10.0) -> str:
    """Read a pty master until `wanted` shows up: the line discipline hands the
    slave's writes over in pieces, so one read may see only the first escape."""
    drawn = ""
    deadline = time.monotonic() + timeout
    while wanted not in drawn and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            drawn += os.read(fd, 65536).decode(errors="replace")
    return drawn
