"""Local TCP ports for the servers a test starts (brokers, Prometheus, metrics endpoints), and
a gate to put in front of one."""

from __future__ import annotations

import contextlib
import socket
import threading


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gate:
    """A TCP forwarder on 127.0.0.1 to ``target_port`` that drops every connection until
    opened: a server that runs but cannot be reached at this address (a firewall, a wrong
    listener). Opened, it forwards both ways; ``close()`` ends it and its connections."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.is_open = False
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self.port = int(self._server.getsockname()[1])
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def open(self) -> None:
        self.is_open = True

    def close(self) -> None:
        self._server.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            if not self.is_open:
                conn.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                conn.close()
                continue
            upstream.settimeout(None)
            self._sockets += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
