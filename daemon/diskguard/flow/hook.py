"""The ``exec`` actuator: runs ``flow_control.on_change`` on every overfull / cleared (edge).

A notification, not a level to converge to: each ``overfull`` / ``overfull_cleared`` runs the
hook once with ``DISKGUARD_*`` variables, on a background thread, never retried.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from diskguard.flow.actuator import Ledger, actuator_log
from diskguard.flow.holds import ClusterHolds
from diskguard.flow.state import Transition

__all__ = ["HookActuator", "HookRunner"]

_OUTPUT_LIMIT: Final = 4096
_HOOK_QUEUE_MAX: Final = 64


def _tail(data: bytes | None) -> str:
    if not data:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= _OUTPUT_LIMIT else "…" + text[-_OUTPUT_LIMIT:]


class HookRunner:
    """Runs the ``on_change`` hook on one background thread, in event order.

    One thread (not one per event) keeps ``overfull`` / ``overfull_cleared`` hooks in the
    order they happened; the timeout bounds how long a hung hook can delay the next one,
    and the daemon loop never waits for either.
    """

    def __init__(
        self,
        argv: Sequence[str],
        timeout_s: float,
        on_failure: Callable[[str, str, str], None],
    ) -> None:
        self._argv = list(argv)
        self._timeout = timeout_s
        self._on_failure = on_failure
        self._queue: queue.Queue[dict[str, str] | None] = queue.Queue(maxsize=_HOOK_QUEUE_MAX)
        #: The hook running now (its own process group), for ``terminate``.
        self._running: subprocess.Popen[bytes] | None = None
        self._running_lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="diskguard-hook", daemon=True)
        self._thread.start()

    def submit(self, env: Mapping[str, str]) -> None:
        try:
            self._queue.put_nowait(dict(env))
        except queue.Full:
            self._on_failure("exec", env.get("DISKGUARD_EVENT", "?"), "hook queue full, dropped")

    def wait_idle(self, timeout_s: float) -> bool:
        """True once every submitted hook has finished (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)

    def terminate(self, grace_s: float = 1.0) -> None:
        """The daemon exits: end the hook running now, children and all (SIGTERM to its
        process group, SIGKILL after ``grace_s``), and wait for it, so nothing it started
        outlives the daemon. Hooks still queued never run (``close`` first)."""
        with self._running_lock:
            proc = self._running
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, grace_s))
        # What ignored SIGTERM, and children left in the group after the hook itself exited.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)

    def _work(self) -> None:
        while True:
            env = self._queue.get()
            try:
                if env is None:
                    return
                self._run(env)
            except Exception as exc:  # a hook must never kill the thread
                self._on_failure("exec", env.get("DISKGUARD_EVENT", "?") if env else "?", repr(exc))
            finally:
                self._queue.task_done()

    def _run(self, extra_env: dict[str, str]) -> None:
        event = extra_env.get("DISKGUARD_EVENT", "?")
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                self._argv,
                env={**os.environ, **extra_env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills children too
            )
        except OSError as exc:
            self._on_failure("exec", event, f"cannot run {self._argv[0]}: {exc.strerror or exc}")
            return
        with self._running_lock:
            self._running = proc
        try:
            self._finish(proc, event, extra_env, started)
        finally:
            with self._running_lock:
                self._running = None

    def _finish(
        self,
        proc: subprocess.Popen[bytes],
        event: str,
        extra_env: dict[str, str],
        started: float,
    ) -> None:
        timed_out = False
        try:
            out, err = proc.communicate(timeout=self._timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                # A grandchild escaped the group and holds the pipes; stop reading them.
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
                proc.wait(timeout=5)
                out, err = b"", b""
        fields = {
            "actuator": "exec",
            "hook_event": event,
            "mount": extra_env.get("DISKGUARD_MOUNT"),
            "argv": self._argv,
            "exit_code": proc.returncode,
            "duration_s": round(time.monotonic() - started, 3),
            "stdout": _tail(out),
            "stderr": _tail(err),
        }
        if timed_out:
            actuator_log().warning("hook_finished", timed_out=True, **fields)
            self._on_failure("exec", event, f"hook killed after {self._timeout:g}s timeout")
        elif proc.returncode != 0:
            actuator_log().warning("hook_finished", timed_out=False, **fields)
            self._on_failure("exec", event, f"hook exited with code {proc.returncode}")
        else:
            actuator_log().info("hook_finished", timed_out=False, **fields)


class HookActuator:
    """``exec``: hands every overfull / cleared transition to the :class:`HookRunner`."""

    name = "exec"

    def __init__(self, argv: Sequence[str], timeout_s: float, ledger: Ledger) -> None:
        self._runner = HookRunner(argv, timeout_s, ledger.failed)

    def on_transition(self, transition: Transition) -> bool:
        self._runner.submit(
            {
                "DISKGUARD_EVENT": transition.event,
                "DISKGUARD_MOUNT": transition.mount,
                "DISKGUARD_USAGE_PERCENT": f"{transition.usage_percent:.2f}",
                "DISKGUARD_FREE_BYTES": str(transition.free_bytes),
                "DISKGUARD_LIMIT": transition.limit or "",
            }
        )
        return True

    def converge(self, confirmed: bool, holds: ClusterHolds) -> bool:
        return True  # nothing to converge: a hook is fired once, never retried

    def wait_idle(self, timeout_s: float) -> bool:
        return self._runner.wait_idle(timeout_s)

    def close(self) -> None:
        self._runner.close()

    def terminate(self, grace_s: float) -> None:
        """The daemon exits: the hook running now goes with it (``HookRunner.terminate``)."""
        self._runner.terminate(min(1.0, grace_s))
