"""systemd's notify protocol, spoken directly (edge).

``Type=notify`` makes systemd wait for ``READY=1`` before it calls the unit started, and
``WatchdogSec=`` restarts the service unless ``WATCHDOG=1`` arrives in time; both are one
datagram to the ``AF_UNIX`` socket named in ``$NOTIFY_SOCKET`` (a leading ``@`` means the
Linux abstract namespace). That is small enough that a dependency (``sdnotify``,
``systemd-python`` with its libsystemd build) buys nothing.

Every function is a no-op without ``$NOTIFY_SOCKET``, so the same code runs under systemd, in
a terminal and in tests. Send failures are swallowed and reported as ``False``: a watchdog
ping that cannot be sent must never take the guard down with it (systemd will notice the
missing ping on its own).
"""

from __future__ import annotations

import os
import socket

__all__ = [
    "notify",
    "ready",
    "reloading",
    "status",
    "stopping",
    "watchdog",
    "watchdog_interval",
]


def _address(raw: str) -> str | bytes | None:
    if raw.startswith("@"):
        # Abstract namespace: the name starts with a NUL byte instead of "@".
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    # vsock: addresses (systemd >= 254 in VMs) are not supported; nothing to do here.
    return None


def notify(*lines: str) -> bool:
    """Send ``KEY=VALUE`` lines as one datagram; True if sent, False if not under systemd."""
    raw = os.environ.get("NOTIFY_SOCKET")
    if not raw or not lines:
        return False
    address = _address(raw)
    if address is None:
        return False
    payload = "\n".join(lines).encode("utf-8", errors="replace")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            # Never block the daemon loop on a receiver that is not reading (a full queue):
            # a dropped STATUS or WATCHDOG datagram is harmless, a stuck guard is not.
            sock.setblocking(False)
            sock.connect(address)
            sock.send(payload)
    except OSError:
        return False
    return True


def ready(status_text: str | None = None) -> bool:
    """Start-up is complete: systemd moves the unit from "activating" to "active"."""
    lines = ["READY=1"]
    if status_text is not None:
        lines.append(_status_line(status_text))
    return notify(*lines)


def status(text: str) -> bool:
    """One line shown by ``systemctl status`` (e.g. worst disk usage, overfull or not)."""
    return notify(_status_line(text))


def watchdog() -> bool:
    """Keep-alive ping; send at least every ``watchdog_interval() / 2`` seconds."""
    return notify("WATCHDOG=1")


def stopping() -> bool:
    """Shutdown has begun: systemd stops expecting watchdog pings."""
    return notify("STOPPING=1")


def reloading() -> bool:
    """A config reload (SIGHUP) has begun; call ``ready()`` again once it is done."""
    return notify("RELOADING=1")


def _status_line(text: str) -> str:
    # A newline would start a new KEY=VALUE assignment inside the datagram.
    return "STATUS=" + " ".join(text.splitlines())


def watchdog_interval() -> float | None:
    """The watchdog timeout in seconds systemd expects pings within, or None if none.

    Follows ``sd_watchdog_enabled()``: ``WATCHDOG_USEC`` must be a positive integer and, when
    ``WATCHDOG_PID`` is set, it must be this process (a child that inherited the environment
    must not ping on its parent's behalf).
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) <= 0:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid is not None and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 1_000_000
