"""sd_notify against a real AF_UNIX datagram socket, as systemd binds it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from diskguard.host import sdnotify


@pytest.fixture
def path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = tmp_path / "notify.sock"
    sock.bind(str(address))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(address))
    yield sock
    sock.close()


@pytest.fixture
def abstract_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"diskguard-test-{os.getpid()}-{id(sock)}"
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    yield sock
    sock.close()


def _recv(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_every_message_on_a_path_socket(path_socket: socket.socket) -> None:
    assert sdnotify.ready()
    assert _recv(path_socket) == ["READY=1"]
    assert sdnotify.ready("watching 2 disks")
    assert _recv(path_socket) == ["READY=1", "STATUS=watching 2 disks"]
    assert sdnotify.status("sda1 93% overfull")
    assert _recv(path_socket) == ["STATUS=sda1 93% overfull"]
    assert sdnotify.watchdog()
    assert _recv(path_socket) == ["WATCHDOG=1"]
    assert sdnotify.reloading()
    assert _recv(path_socket) == ["RELOADING=1"]
    assert sdnotify.stopping()
    assert _recv(path_socket) == ["STOPPING=1"]
    assert sdnotify.notify("A=1", "B=2")
    assert _recv(path_socket) == ["A=1", "B=2"]


def test_status_newlines_cannot_inject_assignments(path_socket: socket.socket) -> None:
    assert sdnotify.status("line one\nREADY=1")
    assert _recv(path_socket) == ["STATUS=line one READY=1"]


def test_abstract_namespace_socket(abstract_socket: socket.socket) -> None:
    assert sdnotify.watchdog()
    assert _recv(abstract_socket) == ["WATCHDOG=1"]


def test_no_op_without_notify_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False
    assert sdnotify.watchdog() is False
    assert sdnotify.status("x") is False


def test_a_vanished_socket_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert sdnotify.watchdog() is False


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert sdnotify.watchdog_interval() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    for bad in ("0", "-5", "soon", ""):
        monkeypatch.setenv("WATCHDOG_USEC", bad)
        assert sdnotify.watchdog_interval() is None


def test_child_process_reaches_the_socket(path_socket: socket.socket) -> None:
    """The daemon runs as its own process under systemd; the env var is all it gets."""
    code = "from diskguard.host import sdnotify; raise SystemExit(0 if sdnotify.ready('up') else 1)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    assert _recv(path_socket) == ["READY=1", "STATUS=up"]
