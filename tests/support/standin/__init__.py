"""Fixture API for the stand-in Kafka broker (``standin.broker``; its docstring says what it
mirrors of a real broker and what it does not).

``start(workdir, log_dirs=[...], topics={...}, ...)`` runs the broker as a subprocess (so its
``.lock`` is held by another process, as a real broker's is) and returns a ``Standin`` handle
once it serves: ``.bootstrap``, ``.state()``, ``.set_rate()``, ``.pause()``, ``.resume()``,
``.commit()``, ``.write()``, ``.roll()``, ``.stop()`` (SIGTERM, clean) and ``.kill()``
(SIGKILL). Topic specs: ``{"partitions": n, "configs": {"cleanup.policy": ...},
"prefill_bytes": per-partition bytes written before it serves}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Standin", "StandinError", "start"]

_TESTS = Path(__file__).resolve().parents[2]
_DAEMON = _TESTS.parent / "daemon"
_DEMO = _TESTS.parent / "demo"


class StandinError(RuntimeError):
    """The stand-in did not start (or died); carries the tail of its log."""


class Standin:
    """A running stand-in broker process."""

    def __init__(self, proc: subprocess.Popen[str], workdir: Path, bootstrap: str) -> None:
        self.proc = proc
        self.workdir = workdir
        self.bootstrap = bootstrap
        self.control_socket = _control_path(workdir)
        self.log_path = workdir / "standin.log"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def control(self, op: str, **args: Any) -> dict[str, Any]:
        """One control-channel command; returns the broker's state after it."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(self.control_socket))
            sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        answer: dict[str, Any] = json.loads(data)
        if "error" in answer:
            raise StandinError(f"control {op}: {answer['error']}")
        return answer

    def state(self) -> dict[str, Any]:
        return self.control("state")

    def partition(self, topic: str, partition: int) -> dict[str, Any]:
        """This partition's entry of ``state()``."""
        for entry in self.state()["partitions"]:
            if entry["topic"] == topic and entry["partition"] == partition:
                return dict(entry)
        raise KeyError((topic, partition))

    def set_rate(self, bytes_per_sec: float) -> dict[str, Any]:
        return self.control("set_rate", bytes_per_sec=bytes_per_sec)

    def pause(self) -> dict[str, Any]:
        return self.control("pause")

    def resume(self) -> dict[str, Any]:
        return self.control("resume")

    def commit(self, group: str, offsets: Sequence[tuple[str, int, int]]) -> dict[str, Any]:
        return self.control("commit", group=group, offsets=[list(o) for o in offsets])

    def write(self, topic: str, partition: int, nbytes: int) -> dict[str, Any]:
        return self.control("write", topic=topic, partition=partition, bytes=nbytes)

    def roll(self, topic: str, partition: int) -> dict[str, Any]:
        return self.control("roll", topic=topic, partition=partition)

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM and wait: the broker's clean shutdown."""
        return self._signal(signal.SIGTERM, timeout)

    def kill(self, timeout: float = 15) -> int:
        """SIGKILL: an unclean stop; the kernel releases the ``.lock``."""
        return self._signal(signal.SIGKILL, timeout)

    def _signal(self, sig: int, timeout: float) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired as exc:
                self.proc.kill()
                self.proc.wait()
                raise StandinError(
                    f"stand-in did not stop in {timeout}s:\n{self.log_tail()}"
                ) from exc
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Standin:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.kill()


def _control_path(workdir: Path) -> Path:
    """``workdir/control.sock``, or a short name in /tmp when that path would not fit a
    unix socket address (108 bytes)."""
    path = workdir / "control.sock"
    if len(os.fsencode(path)) < 100:
        return path
    digest = hashlib.sha1(os.fsencode(workdir)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"standin-{digest}.sock"


def start(
    workdir: str | os.PathLike[str],
    *,
    log_dirs: Sequence[str | os.PathLike[str]],
    topics: Mapping[str, Mapping[str, Any]] | None = None,
    groups: Mapping[str, Sequence[tuple[str, int, int]]] | None = None,
    check_interval_ms: int = 300_000,
    initial_delay_ms: int = 30_000,
    delete_delay_ms: int = 60_000,
    checkpoint_interval_ms: int = 60_000,
    write_rate: float = 0,
    record_bytes: int = 512,
    broker_id: int = 0,
    port: int = 0,
    timeout: float = 20,
) -> Standin:
    """Start a stand-in broker and wait until it serves (or raise ``StandinError``)."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    conf = {
        "broker_id": broker_id,
        "port": port,
        "log_dirs": [str(d) for d in log_dirs],
        "topics": {name: dict(spec) for name, spec in (topics or {}).items()},
        "groups": {g: [list(o) for o in offs] for g, offs in (groups or {}).items()},
        "check_interval_ms": check_interval_ms,
        "initial_delay_ms": initial_delay_ms,
        "delete_delay_ms": delete_delay_ms,
        "checkpoint_interval_ms": checkpoint_interval_ms,
        "write_rate": write_rate,
        "record_bytes": record_bytes,
        "control_socket": str(_control_path(work)),
    }
    conf_path = work / "standin.json"
    conf_path.write_text(json.dumps(conf, indent=1))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_TESTS), str(_DAEMON), str(_DEMO), *filter(None, [env.get("PYTHONPATH")])]
    )
    log_path = work / "standin.log"
    with open(log_path, "a") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "support.standin.broker", str(conf_path)],
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            env=env,
        )
    handle = Standin(proc, work, "")
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            handle.kill()
            raise StandinError(f"stand-in did not start in {timeout}s:\n{handle.log_tail()}")
        ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 0.5))
        if ready:
            line = proc.stdout.readline()
            if line.startswith("bootstrap "):
                handle.bootstrap = line.split()[1]
                return handle
            if not line:
                proc.wait()
                raise StandinError(f"stand-in exited with {proc.returncode}:\n{handle.log_tail()}")
