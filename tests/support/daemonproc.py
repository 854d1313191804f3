"""Run ``diskguard run`` as a real subprocess and follow its JSON event stream (test helper)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class DaemonProc:
    """``diskguard run -c CONFIG`` with every stdout line parsed as one event.

    ``env`` adds to os.environ; ``prefix`` runs the daemon through another command
    (``setpriv ... --`` to run it as another user).
    """

    def __init__(
        self, config: Path, env: dict[str, str] | None = None, prefix: Sequence[str] = ()
    ) -> None:
        self.events: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "diskguard", "run", "-c", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "<not json>", "line": line}
            event["_t"] = time.monotonic()
            self.events.append(event)
            self._queue.put(event)

    def wait_for(
        self,
        name: str,
        timeout: float = 30.0,
        where: Callable[[dict[str, Any]], bool] | None = None,
        **match: Any,
    ) -> dict[str, Any]:
        """The first event named ``name`` (with matching fields, and ``where`` true of it)
        seen so far or arriving."""

        def wanted(event: dict[str, Any]) -> bool:
            return (
                event.get("event") == name
                and all(event.get(k) == v for k, v in match.items())
                and (where is None or where(event))
            )

        deadline = time.monotonic() + timeout
        for event in list(self.events):
            if wanted(event):
                return event
        while time.monotonic() < deadline:
            try:
                event = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if wanted(event):
                return event
            if self.proc.poll() is not None and self._queue.empty():
                break
        raise AssertionError(
            f"no {name} event within {timeout}s; rc={self.proc.poll()} "
            f"events={[e.get('event') for e in self.events]} errors={self.errors()} "
            f"stderr={self.stderr_tail()}"
        )

    def errors(self) -> list[str]:
        """The error events so far, each shortened (what a failed wait should show)."""
        return [
            json.dumps({k: v for k, v in e.items() if k not in ("_t", "timestamp")})[:300]
            for e in self.events
            if e.get("level") == "error"
        ]

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    def stderr_tail(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()[-2000:]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Did not stop: every thread's stack to stderr first (``kill -USR2``,
            # faulthandler), printed below, so the failure says where it hung.
            self.proc.send_signal(signal.SIGUSR2)
            time.sleep(1.0)
            self.proc.kill()
            rc = self.proc.wait()
            self._print_stacks()
        self._reader.join(timeout=5)
        return rc

    def _print_stacks(self) -> None:
        if self.proc.stderr is not None:
            print("daemon did not stop; its stderr (stacks last):", file=sys.stderr)
            print(self.proc.stderr.read()[-20000:], file=sys.stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)

    def __enter__(self) -> DaemonProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
