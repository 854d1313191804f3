"""Run the ``diskguard`` CLI as a real subprocess, as an operator would, and read its output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_cli(
    *args: str,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -m diskguard ARGS`` with text output captured; ``env`` adds to os.environ.
    A command still running at ``timeout`` fails the test with the end of what it said (a
    bare ``TimeoutExpired`` would not say where it was stuck)."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "diskguard", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else {**os.environ, **env},
            cwd=cwd,
            check=check,
        )
    except subprocess.TimeoutExpired as exc:
        said = [_text(exc.stdout)[-2000:], _text(exc.stderr)[-4000:]]
        raise AssertionError(
            f"diskguard {' '.join(args[:1])} still running after {timeout:g} s; "
            f"stdout ends: {said[0]!r}; stderr ends: {said[1]!r}"
        ) from None


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    return output or ""


def plan_json(cfg: Path) -> tuple[dict[str, Any], str]:
    """``diskguard plan --json``: the plan and stderr; exit 0 and no traceback asserted."""
    proc = run_cli("plan", "-c", str(cfg), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def json_events(stdout: str) -> list[dict[str, Any]]:
    """The JSON event lines of a command's output (other lines are skipped)."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
