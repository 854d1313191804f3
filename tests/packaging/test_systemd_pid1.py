"""The shipped unit under a real systemd as PID 1 (systemd-nspawn container).

The container's root is built in a second from this machine's own Debian files, not
downloaded: ``/usr`` bind-mounted read-only (Debian 12 is merged-/usr, so ``/bin``, ``/lib``
and ``/sbin`` are links into it), a copy of ``/etc`` with every enabled service removed (only
systemd's static boot remains) and the user ``kafka`` added, empty ``/var``. A debootstrap'd
root (minbase + systemd + python3) took 2 min 26 s here, too slow for every CI run; this
takes about a second. The venv and the checkout are bound read-only at their own paths.

The unit is ``systemd/diskguard.service`` unchanged plus a drop-in that changes only what
this machine needs: ExecStart (this venv's python, the package from the checkout), the
interpreter, venv or checkout made visible if they live under /root or /home
(ProtectHome=tmpfs instead of yes, plus read-only binds of just those; on a broker host
Python is in /usr and this is not added), and a short WatchdogSec= so the hung-loop case
takes seconds rather than a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "diskguard.service"
CONFIG = REPO / "config" / "diskguard.toml"
DAEMON_SRC = REPO / "daemon"
KAFKA_UID = 990
WATCHDOG_S = 4
BOOT_TIMEOUT_S = 60.0


def _nspawn() -> str:
    path = shutil.which("systemd-nspawn")
    if path is None:
        pytest.fail(
            "systemd-nspawn not installed (make tools: apt-get install systemd-container)",
            pytrace=False,
        )
    return path


def _build_root(root: Path) -> None:
    """A bootable Debian root made of this host's /usr and a trimmed copy of its /etc."""
    root.mkdir()
    for name in ("bin", "sbin", "lib", "lib64"):
        (root / name).symlink_to(f"usr/{name}")
    for name in ("usr", "var/lib", "var/log", "var/tmp", "run", "tmp", "proc", "sys", "dev"):
        (root / name).mkdir(parents=True)
    (root / "tmp").chmod(0o1777)
    # nspawn looks for os-release before it mounts /usr over this placeholder
    (root / "usr/lib").mkdir()
    shutil.copy("/usr/lib/os-release", root / "usr/lib/os-release")
    (root / "var/tmp").chmod(0o1777)
    etc = root / "etc"
    shutil.copytree("/etc", etc, symlinks=True)
    # nothing enabled: only systemd's static units start (no sshd, postgres, timers...)
    for wants in (etc / "systemd" / "system").glob("*.wants"):
        shutil.rmtree(wants)
    (etc / "fstab").write_text("")
    (etc / "machine-id").write_text("")
    with (etc / "passwd").open("a") as f:
        f.write(f"kafka:x:{KAFKA_UID}:{KAFKA_UID}:Kafka:/nonexistent:/usr/sbin/nologin\n")
    with (etc / "group").open("a") as f:
        f.write(f"kafka:x:{KAFKA_UID}:\n")
    data = root / "var/lib/kafka/data"
    data.mkdir(parents=True)
    os.chown(data, KAFKA_UID, KAFKA_UID)
    os.chown(data.parent, KAFKA_UID, KAFKA_UID)
    # a readable secret in a home: ProtectHome= must hide it from the service
    for home in (root / "home" / "alice", root / "root"):
        home.mkdir(parents=True, exist_ok=True)
        (home / "secret").write_text("x")
        (home / "secret").chmod(0o644)
    (root / "root").chmod(0o755)
    # kafka's own directory outside ReadWritePaths=: only the sandbox can refuse writes there
    owned = root / "srv" / "kafka-owned"
    owned.mkdir(parents=True)
    os.chown(owned, KAFKA_UID, KAFKA_UID)

    (etc / "diskguard").mkdir()
    (etc / "diskguard" / "diskguard.toml").write_text(CONFIG.read_text())
    (etc / "systemd" / "system" / "diskguard.service").write_text(UNIT.read_text())
    dropin = etc / "systemd" / "system" / "diskguard.service.d"
    dropin.mkdir()
    exposed = ""
    ours = (Path(sys.base_prefix), Path(sys.prefix), DAEMON_SRC)
    in_home = [p for p in ours if p.is_relative_to("/root") or p.is_relative_to("/home")]
    # A checkout under /tmp (a CI clone): the unit's PrivateTmp=yes gives the service an empty
    # /tmp, so the venv and the source are bound read-only into it, as for the homes below.
    in_tmp = [p for p in ours if p.is_relative_to("/tmp") or p.is_relative_to("/var/tmp")]
    if in_home:
        # The interpreter, venv or checkout lives in a home (pyenv here; /home/runner/work
        # on CI). ProtectHome=yes makes /root and /home mode 000, so not even a bind below
        # them is reachable for kafka; tmpfs keeps every home empty and shows only these.
        exposed += "ProtectHome=tmpfs\n"
    exposed += "".join(f"BindReadOnlyPaths={p}\n" for p in dict.fromkeys(in_home + in_tmp))
    (dropin / "test.conf").write_text(
        textwrap.dedent(
            f"""\
            [Service]
            ExecStart=
            ExecStart={sys.executable} -m diskguard run -c /etc/diskguard/diskguard.toml
            Environment=PYTHONPATH={DAEMON_SRC}
            WatchdogSec={WATCHDOG_S}
            """
        )
        + exposed
    )


@dataclass(frozen=True)
class Container:
    leader: int  # the container's PID 1, as seen from here

    def run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", "--", *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def show(self, prop: str) -> str:
        out = self.run("systemctl", "show", "-P", prop, "diskguard.service")
        return out.stdout.strip()

    def events(self) -> list[dict[str, object]]:
        """The daemon's JSON lines from the journal, oldest first (this boot)."""
        out = self.run("journalctl", "-u", "diskguard.service", "-o", "cat", "--no-pager")
        found = []
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found


def _wait(what: str, check: object, timeout: float, ct: Container | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            log = ct.run("journalctl", "--no-pager", "-n", "60").stdout if ct else ""
            pytest.fail(f"timed out waiting for {what}\n{log}", pytrace=False)
        time.sleep(0.3)


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    root = tmp_path_factory.mktemp("nspawn") / "root"
    _build_root(root)
    venv = Path(sys.prefix)
    binds = ["--bind-ro=/usr", f"--bind-ro={venv}", f"--bind-ro={DAEMON_SRC}"]
    base = Path(sys.base_prefix)
    if not base.is_relative_to("/usr"):
        binds.append(f"--bind-ro={base}")
    machine = f"diskguard-test-{os.getpid()}"
    log = (root.parent / "nspawn.log").open("wb")
    proc = subprocess.Popen(
        [
            _nspawn(),
            "-D",
            str(root),
            "--boot",
            "--register=no",  # no machined on a host whose PID 1 may not be systemd
            "--keep-unit",  # likewise: no scope unit from the host's (absent) systemd
            "--private-network",
            f"--machine={machine}",
            "--console=pipe",
            *binds,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )

    def leader() -> int | None:
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            return None
        for child in children:
            try:
                if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                    return int(child)
            except OSError:
                continue
        return None

    try:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        pid = None
        while pid is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                text = (root.parent / "nspawn.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"systemd-nspawn did not boot (rc {proc.poll()}):\n{text}")
            pid = leader()
            time.sleep(0.2)
        ct = Container(pid)

        def booted() -> bool:
            state = ct.run("systemctl", "is-system-running").stdout.strip()
            return state in ("running", "degraded")

        _wait("the container's boot", booted, BOOT_TIMEOUT_S)
        yield ct
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # nspawn halts the container cleanly
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


@pytest.fixture(scope="module")
def started(container: Container) -> Container:
    """``systemctl start`` of a Type=notify unit returns only after READY=1."""
    result = container.run("systemctl", "start", "diskguard.service", timeout=90)
    assert result.returncode == 0, container.run("journalctl", "--no-pager", "-n", "60").stdout
    return container


def test_ready_only_after_the_first_scan(started: Container) -> None:
    assert started.show("ActiveState") == "active"
    assert started.show("SubState") == "running"
    assert started.show("Type") == "notify"
    # READY=1 came with the status line, which the daemon sends only after the first scan
    assert started.show("StatusText"), "no STATUS= from the daemon"
    names = [e.get("event") for e in started.events()]
    assert "daemon_started" in names, names
    # the journal order: the first scan's event, then systemd's "Started" for the unit
    out = started.run(
        "journalctl",
        "--no-pager",
        "-o",
        "json",
        "_SYSTEMD_UNIT=diskguard.service",
        "+",
        "UNIT=diskguard.service",
    ).stdout
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    scan_at = next(
        int(e["__MONOTONIC_TIMESTAMP"]) for e in entries if "daemon_started" in e["MESSAGE"]
    )
    started_at = next(
        int(e["__MONOTONIC_TIMESTAMP"])
        for e in entries
        if e.get("UNIT") == "diskguard.service" and str(e["MESSAGE"]).startswith("Started ")
    )
    assert scan_at < started_at


def _as_kafka_in_service(ct: Container, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``sh -c script`` as kafka inside the service's own mount namespace."""
    pid = ct.show("MainPID")
    return ct.run(
        "nsenter",
        "-t",
        pid,
        "-m",
        "--",
        "setpriv",
        f"--reuid={KAFKA_UID}",
        f"--regid={KAFKA_UID}",
        "--clear-groups",
        "sh",
        "-c",
        script,
    )


def test_hardening_allows_writes_only_to_state_and_log_dirs(started: Container) -> None:
    assert started.show("User") == "kafka"
    for writable in ("/var/lib/diskguard", "/var/lib/kafka/data", "/var/lib/kafka"):
        probe = f"{writable}/.probe"
        result = _as_kafka_in_service(started, f"echo x > {probe} && rm {probe}")
        assert result.returncode == 0, (writable, result.stderr)
    for readonly in (
        "/srv/kafka-owned",
        "/etc",
        "/usr",
        "/var/lib",
        "/var/log",
        "/",
        str(DAEMON_SRC),
    ):
        result = _as_kafka_in_service(started, f"echo x > {readonly.rstrip('/')}/.probe")
        assert result.returncode != 0, readonly
        assert "Read-only file system" in result.stderr, (readonly, result.stderr)
    # ProtectHome=: the homes' files are invisible to the service (inaccessible, or an empty
    # tmpfs with only the exposed interpreter/venv/checkout when those live in a home)
    for secret in ("/home/alice/secret", "/root/secret"):
        assert _as_kafka_in_service(started, f"cat {secret}").returncode != 0, secret
        outside = ["setpriv", f"--reuid={KAFKA_UID}", f"--regid={KAFKA_UID}", "--clear-groups"]
        assert started.run(*outside, "cat", secret).stdout == "x", secret
    # the same paths are writable for root outside the service's namespace: the sandbox,
    # not the container, is what refuses them
    assert started.run("sh", "-c", "echo x > /etc/.probe && rm /etc/.probe").returncode == 0
    outside = ["setpriv", f"--reuid={KAFKA_UID}", f"--regid={KAFKA_UID}", "--clear-groups"]
    probe = "echo x > /srv/kafka-owned/.probe && rm /srv/kafka-owned/.probe"
    assert started.run(*outside, "sh", "-c", probe).returncode == 0


def test_reload_with_a_bad_config_keeps_the_old_one(started: Container) -> None:
    pid = started.show("MainPID")
    good = started.run("cat", "/etc/diskguard/diskguard.toml").stdout
    bad = good.replace('log_dirs = ["/var/lib/kafka/data"]', 'log_dirs = ["/nonexistent/kafka"]')
    assert bad != good
    write = ["sh", "-c", "cat > /etc/diskguard/diskguard.toml"]
    subprocess.run(
        ["nsenter", "-t", str(started.leader), "-a", "--", *write],
        input=bad,
        text=True,
        check=True,
        timeout=30,
    )
    try:
        result = started.run("systemctl", "reload", "diskguard.service", timeout=60)
        assert result.returncode == 0, result.stderr

        def rejected() -> bool:
            return any(e.get("event") == "config_reload_rejected" for e in started.events())

        _wait("config_reload_rejected", rejected, 30, started)
        assert started.show("MainPID") == pid
        assert started.show("ActiveState") == "active"
        assert not any(e.get("event") == "config_reloaded" for e in started.events())
    finally:
        subprocess.run(
            ["nsenter", "-t", str(started.leader), "-a", "--", *write],
            input=good,
            text=True,
            check=True,
            timeout=30,
        )
    # the same reload path accepts a good config (so the rejection above was the config's)
    assert started.run("systemctl", "reload", "diskguard.service", timeout=60).returncode == 0

    def reloaded() -> bool:
        return any(e.get("event") == "config_reloaded" for e in started.events())

    _wait("config_reloaded", reloaded, 30, started)
    assert started.show("MainPID") == pid


def test_watchdog_restarts_a_hung_daemon(started: Container) -> None:
    pid = started.show("MainPID")
    assert started.show("WatchdogUSec") == f"{WATCHDOG_S}s"
    assert started.run("kill", "-STOP", pid).returncode == 0

    def restarted() -> bool:
        new = started.show("MainPID")
        return new not in ("0", pid) and started.show("ActiveState") == "active"

    # watchdog timeout + TimeoutAbortSec (the unit's TimeoutStopSec=20) + RestartSec=5
    _wait("the watchdog restart", restarted, WATCHDOG_S + 20 + 5 + 30, started)
    out = started.run("journalctl", "--no-pager", "-u", "diskguard.service").stdout
    assert "Watchdog timeout" in out, out[-2000:]
    assert int(started.show("NRestarts")) >= 1
