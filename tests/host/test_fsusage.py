"""fsusage against ``df`` on real loop-mounted ext4 and tmpfs (root), plus mountinfo parsing."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from diskguard.host import fsusage
from diskguard.host.fsusage import Mount
from support import fsfixtures

MiB = 1024 * 1024


def df(path: Path) -> dict[str, str | int]:
    out = subprocess.run(
        ["df", "-B1", "--output=size,used,avail,pcent,target,source", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    size, used, avail, pcent, target, source = out[1].split()
    return {
        "size": int(size),
        "used": int(used),
        "avail": int(avail),
        "pcent": int(pcent.rstrip("%")),
        "target": target,
        "source": source,
    }


def statvfs_math(path: Path) -> tuple[int, int, int]:
    """The brief's formula, written out independently of fsusage."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    denominator = used + avail
    percent = -(-used * 100 // denominator) if denominator else 0  # df rounds up
    return used, avail, percent


def assert_matches_df(path: Path) -> fsusage.FilesystemUsage:
    os.sync()
    usage = fsusage.filesystem_usage(path)
    seen = df(path)
    used, avail, percent = statvfs_math(path)
    assert (used, avail, percent) == (seen["used"], seen["avail"], seen["pcent"])
    assert usage.used_bytes == seen["used"]
    assert usage.available_bytes == seen["avail"]
    assert usage.total_bytes == seen["size"]
    assert fsusage.df_percent(usage) == seen["pcent"]
    assert usage.mount == seen["target"]
    assert usage.device == seen["source"]
    return usage


def test_loop_ext4_matches_df_empty_and_filled(loop_ext4: Callable[..., Path]) -> None:
    mount = loop_ext4(48 * MiB)
    empty = assert_matches_df(mount)
    assert empty.device.startswith("/dev/loop")
    assert fsusage.mount_of(mount) == Mount(str(mount), empty.device)
    fsfixtures.fill(mount / "a", 17 * MiB + 123)
    full = assert_matches_df(mount)
    assert full.used_bytes - empty.used_bytes >= 17 * MiB
    # Without reserved blocks nothing but ext4's own small reservation is neither.
    assert 0 < fsusage.df_percent(full) < 100


def test_loop_ext4_with_reserved_blocks_matches_df(loop_ext4: Callable[..., Path]) -> None:
    """-m 5: root-reserved blocks count as neither used nor available, exactly as in df."""
    mount = loop_ext4(48 * MiB, reserved_percent=5)
    fsfixtures.fill(mount / "a", 20 * MiB)
    usage = assert_matches_df(mount)
    reserved = usage.total_bytes - usage.used_bytes - usage.available_bytes
    assert reserved >= 0.05 * usage.total_bytes * 0.9
    # Usage percent is of used + available, not of the total.
    assert usage.usage_percent > 100 * usage.used_bytes / usage.total_bytes


def test_tmpfs_matches_df(tmpfs: Callable[[int], Path]) -> None:
    mount = tmpfs(16 * MiB)
    usage = assert_matches_df(mount)
    assert usage.device == "tmpfs"
    assert usage.total_bytes == 16 * MiB
    fsfixtures.fill(mount / "x", 5 * MiB)
    assert assert_matches_df(mount).used_bytes == 5 * MiB


def test_file_inside_a_mount_and_symlink_resolve_to_it(
    tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    mount = tmpfs(4 * MiB)
    (mount / "kafka-logs" / "t-0").mkdir(parents=True)
    link = tmp_path / "logs-link"
    link.symlink_to(mount / "kafka-logs")
    expected = Mount(str(mount), "tmpfs")
    assert fsusage.mount_of(mount / "kafka-logs" / "t-0") == expected
    assert fsusage.mount_of(link) == expected
    assert fsusage.filesystem_usage(link).mount == str(mount)


def test_mount_point_with_space_is_unescaped() -> None:
    with fsfixtures.tmpfs(MiB, name="with space\tand tab") as mount:
        assert " " in str(mount)
        assert fsusage.mount_of(mount) == Mount(str(mount), "tmpfs")
        assert fsusage.filesystem_usage(mount / ".").mount == str(mount)


def test_fill_allocates_real_blocks(tmpfs: Callable[[int], Path]) -> None:
    mount = tmpfs(8 * MiB)
    path = fsfixtures.fill(mount / "f", 3 * MiB + 5)
    st = path.stat()
    assert st.st_size == 3 * MiB + 5
    assert st.st_blocks * 512 >= 3 * MiB + 5
    with pytest.raises(OSError):
        fsfixtures.fill(mount / "g", 9 * MiB)


def test_mount_failure_fails_the_test_never_skips(loop_ext4: Callable[..., Path]) -> None:
    """A filesystem mkfs.ext4 refuses (4 KiB) must fail loudly, not skip."""
    before = set(_loop_devices())
    with pytest.raises(pytest.fail.Exception, match="cannot set up a real filesystem"):
        loop_ext4(4096)
    # Nothing left attached by the failed attempt: its image is removed with its temp dir, so
    # a leaked device would show as "(deleted)". (Other tests may attach devices meanwhile.)
    leaked = set(_loop_devices()) - before
    assert not [line for line in leaked if "diskguard-ext4-" in line and "(deleted)" in line]


def _loop_devices() -> list[str]:
    return subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.splitlines()


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 27 7:3 / /data rw,relatime shared:5 master:2 - ext4 /dev/loop3 rw
31 27 7:4 / /data2 rw,relatime - xfs /dev/loop4 rw
32 30 0:40 / /data/kafka\\040logs rw - tmpfs tmp\\040fs rw,size=1024k
33 30 7:5 / /data/stacked rw - ext4 /dev/loop5 rw
34 30 7:6 / /data/stacked rw - ext4 /dev/loop6 rw
"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/data/x/y", Mount("/data", "/dev/loop3")),
        ("/data", Mount("/data", "/dev/loop3")),
        ("/data2/z", Mount("/data2", "/dev/loop4")),
        ("/datax", Mount("/", "/dev/vda")),
        ("/data/kafka logs/t-0", Mount("/data/kafka logs", "tmp fs")),
        ("/data/kafka logsx", Mount("/data", "/dev/loop3")),
        ("/data/stacked/a", Mount("/data/stacked", "/dev/loop6")),
        ("/proc/1", Mount("/proc", "proc")),
    ],
)
def test_mount_of_longest_prefix(
    path: str, expected: Mount, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fsusage.os.path, "realpath", lambda p: os.fspath(p))
    assert fsusage.mount_of(path, mountinfo=MOUNTINFO) == expected


def test_parse_mountinfo_skips_malformed_lines() -> None:
    text = "garbage\n1 2 3\n" + MOUNTINFO
    parsed = fsusage.parse_mountinfo(text)
    assert parsed[0] == ("/proc", "proc", "proc")
    assert ("/data/kafka logs", "tmpfs", "tmp fs") in parsed


def test_no_mount_contains_path() -> None:
    with pytest.raises(ValueError, match="no mount"):
        fsusage.mount_of("/x", mountinfo="31 27 7:4 / /data2 rw - xfs /dev/loop4 rw\n")


def test_df_percent_rounds_up() -> None:
    usage = fsusage.FilesystemUsage("/", "d", 1000, used_bytes=101, available_bytes=899)
    assert fsusage.df_percent(usage) == 11
    assert fsusage.df_percent(fsusage.FilesystemUsage("/", "d", 1000, 100, 900)) == 10
    assert fsusage.df_percent(fsusage.FilesystemUsage("/", "d", 0, 0, 0)) == 0
