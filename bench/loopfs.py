"""Loop-mounted ext4 images for the benchmarks (root only).

Each benchmark gets a filesystem of its own, so that ``du``, the planner and the daemon all
measure the same device, usage numbers are not disturbed by the rest of the machine, and a
3M-file tree is thrown away by unmounting and deleting one file.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

DROP_CACHES = "/proc/sys/vm/drop_caches"


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")


def is_mounted(mountpoint: Path) -> bool:
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        return any(line.split()[1] == target for line in fh if len(line.split()) > 1)


def make_image(image: Path, size_bytes: int, inodes: int) -> None:
    """A sparse image file with a fresh ext4 on it.

    Inode tables are initialised now (``lazy_itable_init=0``): otherwise the kernel's
    ``ext4lazyinit`` thread zeroes them in the background after mount and disturbs timings.
    """
    image.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        image.unlink()
    with open(image, "wb") as fh:
        fh.truncate(size_bytes)
    _run(
        "mkfs.ext4",
        "-q",
        "-F",
        "-m",
        "0",
        "-N",
        str(inodes),
        "-E",
        "lazy_itable_init=0,lazy_journal_init=0",
        str(image),
    )


def mount(image: Path, mountpoint: Path) -> None:
    mountpoint.mkdir(parents=True, exist_ok=True)
    if not is_mounted(mountpoint):
        _run("mount", "-o", "loop", str(image), str(mountpoint))


def umount(mountpoint: Path) -> None:
    if is_mounted(mountpoint):
        _run("umount", str(mountpoint))


@contextlib.contextmanager
def loop_fs(
    image: Path, mountpoint: Path, size_bytes: int, inodes: int, *, reuse: bool, keep: bool
) -> Iterator[bool]:
    """Mount ``image`` (made fresh unless ``reuse`` and it exists); yields True if reused.

    With ``keep`` the image stays on disk after unmounting, for the next run to reuse.
    """
    reused = reuse and image.exists()
    umount(mountpoint)
    if not reused:
        make_image(image, size_bytes, inodes)
    mount(image, mountpoint)
    try:
        yield reused
    finally:
        umount(mountpoint)
        with contextlib.suppress(OSError):
            mountpoint.rmdir()
        if not keep:
            with contextlib.suppress(FileNotFoundError):
                image.unlink()


def drop_caches() -> str | None:
    """Write back and drop the page, dentry and inode caches; None on success, else why not.

    Drops the caches of the loop filesystem and of its backing image file alike, so the next
    command reads directory blocks and inodes from the disk: a *cold* run.
    """
    os.sync()
    try:
        with open(DROP_CACHES, "w", encoding="ascii") as fh:
            fh.write("3\n")
    except OSError as exc:
        return f"cannot drop caches ({DROP_CACHES}: {exc.strerror or exc})"
    return None


def statvfs_usage(path: str | os.PathLike[str]) -> tuple[int, int, float]:
    """``(used, available, percent)`` exactly as df (and diskguard) compute them."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    return used, avail, 100.0 * used / (used + avail) if used + avail else 0.0
