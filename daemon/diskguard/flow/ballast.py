"""The ballast file: space held in reserve for the day the disk fills (edge).

Redpanda's idea: a broker whose disk is 100% full often cannot even start (log recovery
writes before it serves), and deleting data by hand under pressure is how topics get lost.
A ballast file of real, allocated blocks can be deleted in one command
(``diskguard ballast release``) to buy room to run recovery and retention.

Rules that make it safe:

- Blocks are *allocated* (``posix_fallocate``) and checked (``st_blocks * 512 >= size``): a
  sparse file reserves nothing.
- Created crash-safe: a temp name is allocated and fsync'ed, then renamed over the final
  name and the directory fsync'ed; a crash leaves a stale temp (removed next time), never a
  short ballast under the real name.
- Never created when its blocks would make the filesystem overfull or cross the free-space
  floor: the guard must not cause the emergency it exists for.
- After a release, a marker in the state dir stops the daemon from re-creating it until
  the filesystem's next ``overfull_cleared``: re-filling the disk an operator just freed
  would undo the rescue.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from diskguard.config import BallastConfig
from diskguard.flow.state import FlowLimits, Transition
from diskguard.host.atomicfile import fsync_dir, read_json, write_json_atomic
from diskguard.host.fsusage import allocated_bytes
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger

__all__ = ["RELEASED_MARKER", "Ballast", "BallastStatus", "allocated_bytes"]

RELEASED_MARKER: Final = "ballast.released"


def _log() -> Any:
    """Looked up per call: a module-level logger would keep the import-time configuration."""
    return get_logger("diskguard.ballast")


State = Literal["disabled", "present", "created", "released", "refused", "failed", "missing"]


@dataclass(frozen=True)
class BallastStatus:
    state: State
    path: str | None
    size: int
    allocated_bytes: int = 0
    reason: str = ""


class Ballast:
    """One configured ballast file and its released-marker in the daemon's state dir."""

    def __init__(self, cfg: BallastConfig, state_dir: Path) -> None:
        self.path: Path | None = cfg.path
        self.size = cfg.size
        self._marker = Path(state_dir) / RELEASED_MARKER
        self._last_logged: tuple[str, str] | None = None

    # ----------------------------------------------------------------- queries

    @property
    def released(self) -> bool:
        return self._marker.exists()

    def _temp(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.tmp")

    def _stat(self, path: Path) -> os.stat_result | None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"ballast {path} exists and is not a regular file")
        return st

    def status(self) -> BallastStatus:
        """What is on disk now, without changing anything."""
        if self.path is None:
            return BallastStatus("disabled", None, self.size)
        st = self._stat(self.path)
        allocated = allocated_bytes(st) if st is not None else 0
        if self.released and st is None:
            return BallastStatus("released", str(self.path), self.size, 0, "released by operator")
        if st is None:
            return BallastStatus("missing", str(self.path), self.size)
        return BallastStatus("present", str(self.path), self.size, allocated)

    # ----------------------------------------------------------------- actions

    def ensure(self, usage: FilesystemUsage, limits: FlowLimits) -> BallastStatus:
        """Make the ballast exist with ``size`` allocated bytes, unless released or unsafe.

        ``usage``/``limits`` are the ballast's filesystem as the daemon sees it; the blocks
        still missing are checked against them before anything is written. Never raises.
        """
        try:
            result = self._ensure(usage, limits)
        except OSError as exc:
            result = BallastStatus("failed", str(self.path), self.size, 0, exc.strerror or str(exc))
        self._log(result)
        return result

    def _ensure(self, usage: FilesystemUsage, limits: FlowLimits) -> BallastStatus:
        path = self.path
        if path is None:
            return BallastStatus("disabled", None, self.size)
        if self.released:
            st = self._stat(path)
            held = allocated_bytes(st) if st is not None else 0
            return BallastStatus(
                "released",
                str(path),
                self.size,
                held,
                "released by operator; recreated after the next overfull_cleared",
            )
        # A temp left by a crash mid-create holds blocks that count as used; drop it first.
        temp = self._temp(path)
        stale = 0
        with contextlib.suppress(FileNotFoundError):
            stale = allocated_bytes(os.lstat(temp))
            os.unlink(temp)
        st = self._stat(path)
        have = allocated_bytes(st) if st is not None else 0
        if st is not None and have >= self.size and st.st_size >= self.size:
            return BallastStatus("present", str(path), self.size, have)
        missing = self.size - have
        after_cleanup = FilesystemUsage(
            mount=usage.mount,
            device=usage.device,
            total_bytes=usage.total_bytes,
            used_bytes=max(0, usage.used_bytes - stale),
            available_bytes=usage.available_bytes + stale,
        )
        crossed = limits.would_be_overfull_after(after_cleanup, missing)
        if missing > after_cleanup.available_bytes:
            crossed.append(f"available={after_cleanup.available_bytes}")
        if crossed:
            return BallastStatus(
                "refused",
                str(path),
                self.size,
                have,
                f"allocating {missing} more bytes would cross {','.join(crossed)}",
            )
        if st is not None:
            self._fill_in_place(path)
        else:
            self._create(path, temp)
        final = allocated_bytes(os.lstat(path))
        return BallastStatus("created", str(path), self.size, final)

    def _verify(self, fd: int, where: Path) -> None:
        got = allocated_bytes(os.fstat(fd))
        if got < self.size:
            raise OSError(
                f"ballast {where}: only {got} of {self.size} bytes allocated "
                "(filesystem does not reserve blocks on fallocate)"
            )

    def _create(self, path: Path, temp: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.size)
            os.fsync(fd)
            self._verify(fd, temp)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        os.close(fd)
        os.replace(temp, path)
        fsync_dir(path.parent)

    def _fill_in_place(self, path: Path) -> None:
        """An existing but short or sparse ballast: allocating its holes is idempotent."""
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            os.posix_fallocate(fd, 0, self.size)
            os.fsync(fd)
            self._verify(fd, path)
        finally:
            os.close(fd)

    def release(self) -> int:
        """Delete the ballast now; returns the bytes freed (0 if there was none).

        The marker is written *before* the unlink, so a daemon racing with the operator can
        never re-create the file in between.
        """
        if self.path is None:
            raise ValueError("ballast.path is not set")
        self._marker.parent.mkdir(parents=True, exist_ok=True)
        st = self._stat(self.path)
        freed = allocated_bytes(st) if st is not None else 0
        write_json_atomic(
            self._marker,
            {
                "path": str(self.path),
                "released_at": dt.datetime.now(tz=dt.UTC).isoformat(),
                "freed_bytes": freed,
            },
        )
        for victim in (self.path, self._temp(self.path)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(victim)
        with contextlib.suppress(FileNotFoundError):
            fsync_dir(self.path.parent)
        _log().warning("ballast_released", path=str(self.path), freed_bytes=freed)
        return freed

    def rearm(self) -> bool:
        """Forget a release: the next ``ensure`` may create the ballast again."""
        try:
            os.unlink(self._marker)
        except FileNotFoundError:
            return False
        fsync_dir(self._marker.parent)
        _log().info("ballast_rearmed", path=str(self.path))
        return True

    def released_info(self) -> dict[str, object] | None:
        info = read_json(self._marker, None)
        return info if isinstance(info, dict) else None

    def on_transition(self, transition: Transition) -> None:
        """Re-arm after the ballast's own filesystem clears overfull. Never raises."""
        if transition.event != "overfull_cleared" or self.path is None or not self.released:
            return
        # By device: the transition's mount labels a device, which the ballast may reach
        # through another mount point (a bind mount).
        try:
            ballast_dev = os.stat(self.path.parent).st_dev
        except OSError as exc:
            _log().error("ballast_mount_unknown", path=str(self.path), error=str(exc))
            return
        try:
            if os.stat(transition.mount).st_dev != ballast_dev:
                return
        except OSError:
            return  # not a filesystem this host has (any more): not the ballast's
        try:
            self.rearm()
        except OSError as exc:
            _log().error(
                "ballast_rearm_failed", path=str(self.path), error=exc.strerror or str(exc)
            )

    def _log(self, result: BallastStatus) -> None:
        """One line per change of outcome, not one per cycle."""
        key = (result.state, result.reason)
        if key == self._last_logged:
            return
        self._last_logged = key
        fields = {
            "path": result.path,
            "size": result.size,
            "allocated_bytes": result.allocated_bytes,
        }
        if result.state == "created":
            _log().info("ballast_created", **fields)
        elif result.state == "refused":
            _log().warning("ballast_refused", reason=result.reason, **fields)
        elif result.state == "failed":
            _log().error("ballast_failed", reason=result.reason, **fields)
