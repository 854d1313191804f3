"""One real Kafka server process (a broker, a KRaft combined node, or ZooKeeper) on 127.0.0.1.

Every process runs as ``nobody`` in its own session, as production brokers run as a non-root
user: as root a broker writes into ext4's reserved blocks and a "full" disk is not full to it.
Its work dir (properties, log4j configs, ``server.log``, ``pid``) and its log dirs are handed
to ``nobody``. ``start`` returns once the server says it started and answers on its port, or
raises ``ServerSetupError`` with the end of its log; ``stop`` is SIGTERM (a controlled
shutdown) then SIGKILL after a bound; ``kill`` is kill -9 (the next start runs log recovery).

The pid file lets another process (the runner, ``python -m support.kafka``) stop what this
one started.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from support.kafka.classpath import Release

USER = "nobody"
#: Every node of every test cluster shares it: 16 bytes, base64 as Kafka's Uuid prints it.
CLUSTER_ID = base64.urlsafe_b64encode(b"diskguard-tests!").decode().rstrip("=")

# Log4j 2's own properties format: YAML would need jackson-dataformat-yaml, which only
# some releases carry.
_LOG4J2 = """\
status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.zookeeper.name = org.apache.zookeeper
logger.zookeeper.level = WARN
"""
# A distribution's own log4j 1 (2.x/3.x ship it in libs/) reads this instead.
_LOG4J1 = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.org.apache.zookeeper=WARN
"""


class ServerSetupError(RuntimeError):
    """A server did not start (the message ends with the last lines of its log)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hand_to_user(path: Path) -> None:
    """``path`` owned by the server's user, and every dir above it traversable (pytest's
    temp dirs are 0700 root)."""
    user = pwd.getpwnam(USER)
    os.chown(path, user.pw_uid, user.pw_gid)
    for parent in path.parents:
        if parent == Path("/"):
            break
        mode = parent.stat().st_mode
        if mode & 0o001 == 0:
            os.chmod(parent, (mode & 0o7777) | 0o011)


#: util-linux's setpriv sets the parent-death signal after the switch to ``USER`` (a change of
#: credentials clears it), then execs the JVM.
_DIE_WITH_STARTER = ["setpriv", "--pdeathsig", "KILL", "--"]


def write_readable(path: Path, text: str) -> None:
    """Write a file the server's user can read whatever the writer's umask."""
    path.write_text(text)
    os.chmod(path, 0o644)


def _java() -> str:
    home = os.environ.get("JAVA_HOME", "").strip()
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ServerSetupError("java not found (`make tools` installs a JDK 17)")
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


#: Servers die with the process (strictly: the thread) that started them, so a test run that
#: is killed (a timeout, ^C twice) leaves no broker behind eating the machine. The runner
#: (``python -m support.kafka start``) sets it: its brokers must outlive the command.
OUTLIVE_STARTER = False


class JavaServer:
    """A JVM server process in ``workdir``, as ``nobody``, its output in ``server.log``."""

    #: A line of the server's log that says it is up.
    started_line = ""

    def __init__(
        self,
        release: Release,
        classpath: Sequence[Path],
        workdir: Path,
        port: int,
        heap_mb: int = 320,
    ) -> None:
        self.release = release
        self.classpath = tuple(classpath)
        self.workdir = workdir
        self.port = port
        self.heap_mb = heap_mb
        self._proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    # -- files ------------------------------------------------------------------------------
    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    @property
    def pid_path(self) -> Path:
        return self.workdir / "pid"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_since_start(self) -> str:
        """What the server logged since its last ``launch`` (its log spans restarts)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(getattr(self, "_log_offset", 0))
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _prepare_workdir(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        write_readable(self.workdir / "log4j2.properties", _LOG4J2)
        write_readable(self.workdir / "log4j.properties", _LOG4J1)
        hand_to_user(self.workdir)

    # -- process ----------------------------------------------------------------------------
    def main_class(self) -> str:
        raise NotImplementedError

    def arguments(self) -> list[str]:
        raise NotImplementedError

    def _command(self, main: str, *args: str) -> list[str]:
        return [
            _java(),
            f"-Xmx{self.heap_mb}m",
            f"-Xms{min(self.heap_mb, 128)}m",
            "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
            f"-Dkafka.logs.dir={self.workdir}",
            "-cp",
            os.pathsep.join(map(str, self.classpath)),
            main,
            *args,
        ]

    def run_tool(self, main: str, *args: str, timeout: float = 120) -> str:
        """A Kafka tool's main class on this server's classpath, as ``nobody``; its output."""
        result = subprocess.run(
            self._command(main, *args),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.workdir,
            user=USER,
            group=pwd.getpwnam(USER).pw_gid,
        )
        if result.returncode != 0:
            raise ServerSetupError(
                f"{main} {' '.join(args)} exited {result.returncode}: "
                f"{(result.stderr or result.stdout).strip()[-2000:]}"
            )
        return result.stdout

    def launch(self) -> None:
        """Start the process and return at once (``wait_started`` waits for it)."""
        if self.alive():
            raise ServerSetupError(f"{self.workdir}: already running (pid {self.pid()})")
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            tie = [] if OUTLIVE_STARTER or not shutil.which("setpriv") else _DIE_WITH_STARTER
            self._proc = subprocess.Popen(
                [*tie, *self._command(self.main_class(), *self.arguments())],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                user=USER,
                group=pwd.getpwnam(USER).pw_gid,
                start_new_session=True,
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")
        self.started_at = time.monotonic()

    def wait_started(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_since_start()
            if self.started_line in text and self._answers():
                return
            if not self.alive():
                raise ServerSetupError(
                    f"{type(self).__name__} in {self.workdir} exited at start-up: "
                    f"{self._tail(text)}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise ServerSetupError(
                    f"{type(self).__name__} in {self.workdir} not started within {timeout:.0f} s: "
                    f"{self._tail(text)}"
                )
            time.sleep(0.2)

    def start(self, timeout: float = 120) -> None:
        self.launch()
        self.wait_started(timeout)

    @staticmethod
    def _tail(text: str, lines: int = 25) -> str:
        return "\n".join(text.strip().splitlines()[-lines:]) or "(empty log)"

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
            return True
        return False

    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        with contextlib.suppress(OSError, ValueError):
            return int(self.pid_path.read_text().strip())
        return None

    def alive(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        pid = self.pid()
        return pid is not None and _alive(pid)

    def _signal(self, sig: signal.Signals) -> None:
        pid = self.pid()
        if pid is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)

    def _wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def terminate(self) -> None:
        """SIGTERM (Kafka's controlled shutdown) without waiting."""
        self._signal(signal.SIGTERM)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM, then SIGKILL if it has not exited by ``timeout``."""
        self.terminate()
        if not self._wait_exit(timeout):
            self.kill()

    def kill(self) -> None:
        """kill -9: no shutdown, no flush; the next start recovers the log."""
        self._signal(signal.SIGKILL)
        self._wait_exit(30)

    def pause(self) -> None:
        """SIGSTOP: a hung broker (connections accepted by the kernel, never answered)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)


def properties_text(settings: Mapping[str, object]) -> str:
    return "".join(f"{k}={v}\n" for k, v in settings.items())
