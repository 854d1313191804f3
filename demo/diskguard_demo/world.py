"""Where the demo happens: its sandbox dir, and a real Kafka broker on a disk of its own.

The broker is the project's harness (``tests/support/kafka``: Apache Kafka from Maven Central,
a KRaft combined broker+controller run as ``nobody`` on free ports), its log dir on a fresh
loop-mounted ext4 (``support.fsfixtures``) with ext4's usual 5 % root reserve: as production
brokers, it runs as a non-root user, so a full disk is full to it. Both live in temp dirs
(the broker's user must reach them; the user's own dirs are never opened up for it), and
what the user keeps is copied into the sandbox: the broker's log, the daemon's, the report.

A run killed with -9 leaves a mounted loop disk and maybe a broker: the sandbox records
where they are (``.workspace``), and the next run removes them first.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from diskguard_demo.errors import Refused
from support import fsfixtures
from support.kafka import Target
from support.kafka.broker import acl_settings
from support.kafka.cluster import KafkaCluster

MiB = 1024 * 1024
#: The broker's disk: small enough to fill in seconds, big enough for the story.
DISK_BYTES = 320 * MiB
#: ext4's default root reserve: the broker (nobody) cannot write into it, as in production.
RESERVED_PERCENT = 5
#: The broker's retention check and delete delay. Kafka's defaults are 300 s and 60 s, which
#: is why diskguard asks ahead of the ceiling (the reclaim forecast); here 5 s and 10 s, so
#: the story fits in two minutes with the same mechanics: space asked for comes back 10 to
#: 15 s later, long enough for a burst to outrun it and flow control to hold producers back.
CHECK_INTERVAL_MS = 5000
DELETE_DELAY_MS = 10_000
HEAP_MB = 256
#: Marks a directory this demo created, so a rerun may wipe it and nothing else.
MARKER = ".diskguard-demo"


@dataclass(frozen=True)
class Sandbox:
    """The user's dir of the run: config, logs, state, report (``./demo-out``)."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "diskguard.toml"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def rescue_log(self) -> Path:
        return self.root / "enforce.log"

    @property
    def broker_log(self) -> Path:
        return self.root / "broker.log"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def workspace_record(self) -> Path:
        return self.root / ".workspace"

    def prepare(self) -> list[str]:
        """Create it afresh; wipe only a directory an earlier demo made (it has the marker),
        after removing what an interrupted run left running or mounted. What was removed."""
        root = self.root
        cleaned: list[str] = []
        if root.exists():
            if not root.is_dir():
                raise Refused(f"{root}: exists and is not a directory")
            if any(root.iterdir()) and not (root / MARKER).exists():
                raise Refused(
                    f"{root}: not empty and not made by the demo; refusing to wipe it"
                    " (choose another --dir)"
                )
            cleaned = remove_leftovers(self.workspace_record)
            for entry in root.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        root.mkdir(parents=True, exist_ok=True)
        (root / MARKER).write_text("made by python -m diskguard_demo; safe to delete\n")
        self.state_dir.mkdir()
        return cleaned


def remove_leftovers(record: Path) -> list[str]:
    """Stop the broker and unmount the disk an earlier run recorded in ``record`` (it was
    killed before it could); what was done, one phrase each."""
    try:
        where = json.loads(record.read_text())
    except (OSError, ValueError):
        return []
    done: list[str] = []
    broker_root = Path(where.get("broker_root", ""))
    if (broker_root / "cluster.json").is_file():
        with contextlib.suppress(Exception):
            cluster = KafkaCluster.load(broker_root)
            if cluster.alive():
                cluster.kill()
                done.append(f"killed the broker in {broker_root}")
    mount = Path(where.get("mount", ""))
    if where.get("mount") and mount.is_dir():
        if mount.is_mount():
            subprocess.run(["umount", str(mount)], capture_output=True, check=False)
            done.append(f"unmounted {mount}")
        image = mount.parent / "disk.img"
        listed = subprocess.run(
            ["losetup", "-j", str(image)], capture_output=True, text=True, check=False
        ).stdout
        for line in listed.splitlines():
            device = line.split(":", 1)[0]
            subprocess.run(["losetup", "-d", device], capture_output=True, check=False)
            done.append(f"detached {device}")
        shutil.rmtree(mount.parent, ignore_errors=True)
    if where.get("broker_root"):
        shutil.rmtree(broker_root, ignore_errors=True)
    record.unlink(missing_ok=True)
    return done


def broker_settings(chosen: Target) -> dict[str, str]:
    """The broker's settings beyond the harness's: fast retention checks, and the release's
    ACL authorizer letting everyone in where a resource has no ACL (what the ``acl``
    actuator's hold is for)."""
    settings = {
        "log.retention.check.interval.ms": str(CHECK_INTERVAL_MS),
        "log.segment.delete.delay.ms": str(DELETE_DELAY_MS),
    }
    if chosen.release.version >= (3, 8, 0):
        settings["log.initial.task.delay.ms"] = "1000"
    return settings | acl_settings(chosen.release, chosen.mode)


class BrokerHost:
    """The disk and the broker, for the length of a ``with`` block.

    Leaving the block stops the broker (kill -9 if it does not stop), copies its log into
    the sandbox, unmounts the disk and removes the temp dirs, whatever happened inside.
    """

    def __init__(self, sandbox: Sandbox, chosen: Target) -> None:
        self.sandbox = sandbox
        self.chosen = chosen
        self._stack = contextlib.ExitStack()
        self.mount = Path()
        self.cluster: KafkaCluster | None = None
        self._log_pos = 0

    def __enter__(self) -> BrokerHost:
        try:
            self.mount = self._stack.enter_context(
                fsfixtures.loop_ext4(DISK_BYTES, RESERVED_PERCENT, name="kafka-disk")
            )
            broker_root = Path(tempfile.mkdtemp(prefix="diskguard-demo-broker-"))
            self._stack.callback(shutil.rmtree, broker_root, True)
            self.sandbox.workspace_record.write_text(
                json.dumps({"mount": str(self.mount), "broker_root": str(broker_root)}) + "\n"
            )
            self._stack.callback(self.sandbox.workspace_record.unlink, True)
            self.cluster = KafkaCluster(
                self.chosen.release,
                self.chosen.classpath,
                broker_root,
                [[self.mount / "kafka-logs"]],
                mode=self.chosen.mode,
                settings=broker_settings(self.chosen),
                heap_mb=HEAP_MB,
            )
            self._stack.callback(self._stop_broker)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()

    @property
    def broker(self) -> KafkaCluster:
        assert self.cluster is not None
        return self.cluster

    @property
    def log_dir(self) -> Path:
        return self.broker.log_dir

    @property
    def server_properties(self) -> Path:
        return self.broker.workdir / "server.properties"

    def new_log_lines(self) -> list[str]:
        """The complete lines the broker logged since the last call (its log spans its
        restarts)."""
        try:
            with open(self.broker.node.log_path, "rb") as log:
                log.seek(self._log_pos)
                data = log.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self._log_pos += end
        return data[:end].decode(errors="replace").splitlines()

    def _stop_broker(self) -> None:
        cluster = self.cluster
        if cluster is None:
            return
        with contextlib.suppress(Exception):
            cluster.stop(timeout=20)
        with contextlib.suppress(OSError):
            shutil.copyfile(cluster.node.log_path, self.sandbox.broker_log)
