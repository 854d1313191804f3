"""Whether a pid names a running process: any number read from a file is an answer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from diskguard.host.processes import PID_MAX_LIMIT, running


def test_a_live_process_runs_and_an_ended_one_does_not() -> None:
    assert running(os.getpid())
    assert running(1)  # init: another user's or not, it is there
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert not running(int(ended.stdout))


@pytest.mark.parametrize("pid", [0, -1, -(2**70), PID_MAX_LIMIT + 1, 2**63, 10**30])
def test_a_pid_no_process_can_have_is_not_running(pid: int) -> None:
    assert not running(pid)
