"""The progress bar draws on a terminal (a real pty) and stays silent in a pipe."""

from __future__ import annotations

import io
import os

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
        os.set_blocking(master, False)
        drawn = os.read(master, 65536).decode(errors="replace")
    finally:
        os.close(slave)
        os.close(master)
    assert "scanning log dirs" in drawn
