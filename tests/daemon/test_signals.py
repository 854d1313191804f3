"""A stop signal at any moment of the loop's wait stops the daemon.

A signal handler runs on the main thread between any two bytecodes. The loop used to wait
on a ``threading.Event`` whose lock it holds for a moment inside ``wait``; a SIGTERM landing
then made the handler wait for that lock, held by its own thread: the daemon never stopped
(seen once in CI, reproduced at about one stop in 100 right after an inotify hint). These
tests run the handler, as the interpreter would, at every bytecode of the loop's wait.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from diskguard.config import load_config
from diskguard.daemon.loop import Daemon
from support.configs import write_config


def _daemon(tmp_path: Path) -> Daemon:
    log_dir = tmp_path / "kafka"
    (log_dir / "orders-0").mkdir(parents=True)
    return Daemon(load_config(write_config(tmp_path, log_dir, check_interval="200ms")))


def _wait_with_a_signal_at(d: Daemon, at: int, handler: Any, signum: int) -> tuple[bool, int]:
    """``d._wait`` after a hint, with ``handler`` run at its ``at``-th bytecode (counting
    into what it calls): whether it returned (in a thread, so a deadlock fails instead of
    hanging the suite), and how many bytecodes a whole wait ran."""
    seen = [0]

    def trace(frame: FrameType, event: str, _arg: object) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            if seen[0] == at:
                handler(signum, frame)
            seen[0] += 1
        return trace

    def run() -> None:
        sys.settrace(trace)
        try:
            d._wait(5.0)
        finally:
            sys.settrace(None)

    d._on_hint()  # woken by a hint, the moment the stop hung in CI
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    return not thread.is_alive(), seen[0]


@pytest.mark.parametrize(
    ("handler", "flag", "signum"),
    [("_on_stop", "_stopping", signal.SIGTERM), ("_on_hup", "_reload", signal.SIGHUP)],
    ids=["stop", "reload"],
)
def test_a_signal_at_any_bytecode_of_the_wait_is_kept_and_never_hangs(
    tmp_path: Path, handler: str, flag: str, signum: int
) -> None:
    d = _daemon(tmp_path)
    at = 0
    while True:
        returned, ran = _wait_with_a_signal_at(d, at, getattr(d, handler), signum)
        assert returned, f"signal {signum} at bytecode {at} of the loop's wait: the loop hung"
        if at >= ran:
            break  # the whole wait ran without reaching ``at``: every moment was tried
        assert getattr(d, flag), f"signal {signum} at bytecode {at} was lost"
        setattr(d, flag, False)
        at += 1
    assert at > 20, f"only {at} bytecodes traced: the test did not see the wait"
