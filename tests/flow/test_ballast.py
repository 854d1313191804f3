"""The ballast file on a REAL tmpfs mount: real blocks, release, re-arm, refusal.

Mounting needs root (tests run as root here and in CI); the ``tmpfs`` fixture fails the
test rather than skipping it when it cannot mount.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from diskguard.config import BallastConfig
from diskguard.flow.ballast import RELEASED_MARKER, Ballast
from diskguard.flow.state import FlowLimits, Transition
from diskguard.host import fsusage
from diskguard.kafkalog.model import FilesystemUsage
from support import configs
from support.disks import disk_free

MiB = 1024**2
DISKGUARD = Path(sys.executable).parent / "diskguard"
NO_LIMITS = FlowLimits(min_free_bytes=0)


def usage(path: Path) -> FilesystemUsage:
    return fsusage.filesystem_usage(path)


def cleared(mount: Path | str) -> Transition:
    return Transition("overfull_cleared", str(mount), "store overfull condition cleared", 10.0, 1)


def write_config(tmp_path: Path, mount: Path, size: str = "16MiB", ballast: bool = True) -> Path:
    log_dir = mount / "kafka-logs"
    log_dir.mkdir(exist_ok=True)
    return configs.write_config(
        tmp_path,
        log_dir,
        flow_control={"overfull_percent": 90, "underfull_percent": 80},
        ballast={"path": mount / "ballast", "size": size} if ballast else None,
        assume_delete_policy=None,
    )


def diskguard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DISKGUARD), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_ensure_allocates_real_blocks_visible_in_statvfs(
    tmp_path: Path, tmpfs: Callable[[int], Path]
) -> None:
    mount = tmpfs(64 * MiB)
    ballast = Ballast(BallastConfig(path=mount / "ballast", size=16 * MiB), tmp_path / "state")
    before = disk_free(mount)
    result = ballast.ensure(usage(mount), NO_LIMITS)
    assert result.state == "created", result
    st = os.stat(mount / "ballast")
    assert st.st_blocks * 512 >= 16 * MiB and st.st_size == 16 * MiB
    assert before - disk_free(mount) >= 16 * MiB
    assert sorted(p.name for p in mount.iterdir()) == ["ballast"]  # no temp left behind
    again = ballast.ensure(usage(mount), NO_LIMITS)
    assert again.state == "present" and again.allocated_bytes >= 16 * MiB


def test_release_frees_it_and_it_stays_gone_until_overfull_cleared(
    tmp_path: Path, tmpfs: Callable[[int], Path]
) -> None:
    mount = tmpfs(64 * MiB)
    config = write_config(tmp_path, mount)
    ballast = Ballast(BallastConfig(path=mount / "ballast", size=16 * MiB), tmp_path / "state")
    assert ballast.ensure(usage(mount), NO_LIMITS).state == "created"
    before = disk_free(mount)

    done = diskguard("ballast", "release", "-c", str(config))
    assert done.returncode == 0, done.stderr
    assert f"({16 * MiB} bytes)" in done.stdout
    assert not (mount / "ballast").exists()
    assert disk_free(mount) - before >= 16 * MiB
    assert (tmp_path / "state" / RELEASED_MARKER).exists()

    # The daemon keeps trying every cycle; released means it does nothing.
    assert ballast.ensure(usage(mount), NO_LIMITS).state == "released"
    assert not (mount / "ballast").exists()
    # An overfull_cleared on another filesystem, or an overfull here, does not re-arm.
    ballast.on_transition(cleared("/somewhere/else"))
    ballast.on_transition(Transition("overfull", str(mount), "store overfull", 95.0, 1, limit="x"))
    assert ballast.ensure(usage(mount), NO_LIMITS).state == "released"
    status = diskguard("ballast", "status", "-c", str(config))
    assert status.returncode == 0 and "released" in status.stdout
    # This filesystem's overfull_cleared re-arms it.
    ballast.on_transition(cleared(mount))
    assert ballast.ensure(usage(mount), NO_LIMITS).state == "created"
    assert os.stat(mount / "ballast").st_blocks * 512 >= 16 * MiB


def test_refuses_to_cross_the_overfull_limit_or_the_floor(
    tmp_path: Path, tmpfs: Callable[[int], Path], fill: Callable[..., Path]
) -> None:
    mount = tmpfs(64 * MiB)
    fill(mount / "data", 28 * MiB)  # ~44%
    ballast = Ballast(BallastConfig(path=mount / "ballast", size=8 * MiB), tmp_path / "state")
    before = disk_free(mount)
    percent = FlowLimits(overfull_percent=50, underfull_percent=40, min_free_bytes=0)
    refused = ballast.ensure(usage(mount), percent)
    assert refused.state == "refused" and "overfull_percent=50%" in refused.reason
    floor = FlowLimits(min_free_bytes=32 * MiB)
    refused = ballast.ensure(usage(mount), floor)
    assert refused.state == "refused" and f"min_free_bytes={32 * MiB}" in refused.reason
    too_big = Ballast(BallastConfig(path=mount / "big", size=128 * MiB), tmp_path / "state")
    assert too_big.ensure(usage(mount), NO_LIMITS).state == "refused"
    assert disk_free(mount) == before
    assert sorted(p.name for p in mount.iterdir()) == ["data"]
    # With room under the limit it goes ahead.
    roomy = FlowLimits(overfull_percent=70, underfull_percent=60, min_free_bytes=8 * MiB)
    assert ballast.ensure(usage(mount), roomy).state == "created"


def test_crash_leftovers_are_repaired(tmp_path: Path, tmpfs: Callable[[int], Path]) -> None:
    mount = tmpfs(64 * MiB)
    # A crash mid-create leaves the temp name; a hand-made ballast may be sparse.
    (mount / ".ballast.tmp").write_bytes(b"\0" * MiB)
    with open(mount / "ballast", "wb") as handle:
        handle.truncate(16 * MiB)  # sparse: length without blocks
    assert os.stat(mount / "ballast").st_blocks == 0
    ballast = Ballast(BallastConfig(path=mount / "ballast", size=16 * MiB), tmp_path / "state")
    result = ballast.ensure(usage(mount), NO_LIMITS)
    assert result.state == "created"
    assert os.stat(mount / "ballast").st_blocks * 512 >= 16 * MiB
    assert sorted(p.name for p in mount.iterdir()) == ["ballast"]


def test_cli_create_and_errors(tmp_path: Path, tmpfs: Callable[[int], Path]) -> None:
    mount = tmpfs(64 * MiB)
    config = write_config(tmp_path, mount, size="8MiB")
    made = diskguard("ballast", "create", "-c", str(config))
    assert made.returncode == 0, made.stderr
    assert os.stat(mount / "ballast").st_blocks * 512 >= 8 * MiB
    # Release with no file left: still exit 0, nothing freed.
    assert diskguard("ballast", "release", "-c", str(config)).returncode == 0
    again = diskguard("ballast", "release", "-c", str(config))
    assert again.returncode == 0 and "(0 bytes)" in again.stdout
    # create would push the disk past overfull_percent = 90: refused, exit 3.
    huge = write_config(tmp_path, mount, size="60MiB")
    refused = diskguard("ballast", "create", "-c", str(huge))
    assert refused.returncode == 3 and "refused" in refused.stderr
    assert not (mount / "ballast").exists()
    unset = write_config(tmp_path, mount, ballast=False)
    missing = diskguard("ballast", "release", "-c", str(unset))
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "ballast.path" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_cli_status_without_a_ballast_says_so_and_exits_0(
    tmp_path: Path, tmpfs: Callable[[int], Path]
) -> None:
    """No ballast is a valid setup, not a usage error: ``status`` reports it (exit 0), while
    ``release``/``create``, which cannot do what they are asked, still exit 2."""
    mount = tmpfs(16 * MiB)
    unset = write_config(tmp_path, mount, ballast=False)
    proc = diskguard("ballast", "status", "-c", str(unset))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "no ballast configured (ballast.path is not set)\n"
    assert proc.stderr == ""
    assert diskguard("ballast", "create", "-c", str(unset)).returncode == 2
