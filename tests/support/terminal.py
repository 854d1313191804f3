"""Run a command with its stdout on a pseudo-terminal (test helper): what a person sees."""

from __future__ import annotations

import os
import pty
import subprocess


def on_a_terminal(argv: list[str], timeout: float = 120) -> tuple[str, int]:
    """Run ``argv`` with stdout on a pty (stderr to a pipe, a wide colour terminal); its
    output and exit code."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "400", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(argv, stdout=follower, stderr=subprocess.PIPE, close_fds=True, env=env)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return out.decode(), proc.wait(timeout=timeout)
