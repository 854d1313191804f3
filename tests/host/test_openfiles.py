"""Deleted-but-open files on a real tmpfs, held by a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from diskguard.host.openfiles import (
    bytes_by_device,
    deleted_open_files,
    held_by_mount,
    scan_deleted_open_files,
)

pytestmark = pytest.mark.root

MiB = 1024 * 1024

# Opens PATH twice (two descriptors, one inode), writes 5 MiB, unlinks it, then waits.
HOLDER = textwrap.dedent(
    """
    import os, sys
    path = sys.argv[1]
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b"k" * (5 * 1024 * 1024))
    os.fsync(fd)
    dup = os.open(path, os.O_RDONLY)
    os.unlink(path)
    print(fd, dup, flush=True)
    sys.stdin.read()
    """
)


def _used(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _walked(mnt: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(mnt):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def test_unlinked_file_held_open_is_found(tmpfs: Callable[[int], Path]) -> None:
    mnt = tmpfs(64 * MiB)
    (mnt / "visible.log").write_bytes(b"v" * 4096)
    # A live file whose *name* ends like the kernel's marker must not be reported.
    (mnt / "tricky (deleted)").write_bytes(b"t" * 4096)
    tricky = open(mnt / "tricky (deleted)", "rb")  # noqa: SIM115 - held across the test
    before = _used(mnt)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(mnt / "00000000000000000000.log")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        fd, dup = (int(x) for x in holder.stdout.readline().split())
        assert not (mnt / "00000000000000000000.log").exists()

        files = deleted_open_files({str(mnt)})
        mine = [f for f in files if f.pid == holder.pid]
        assert {f.fd for f in mine} == {fd, dup}
        assert all(f.path == str(mnt / "00000000000000000000.log") for f in mine)
        assert all(f.comm.startswith("python") for f in mine)
        assert all(f.bytes == 5 * MiB and f.size == 5 * MiB for f in mine)
        assert all(f.device == os.stat(mnt).st_dev for f in mine)
        assert [f for f in files if "tricky" in f.path] == []

        # Two descriptors, one inode: the space is held once.
        assert bytes_by_device(files)[os.stat(mnt).st_dev] == 5 * MiB
        assert scan_deleted_open_files([os.stat(mnt).st_dev]).total_bytes == 5 * MiB
        # Per mount point, as the daemon reports it (diskguard_filesystem_deleted_open_bytes).
        assert held_by_mount([str(mnt)]) == {str(mnt): 5 * MiB}
        # Narrowed to the holder's pid, by device id.
        only = scan_deleted_open_files([os.stat(mnt).st_dev], pids=[holder.pid])
        assert {f.pid for f in only.files} == {holder.pid}

        # df sees the space, a directory walk does not: the gap the report explains.
        assert _used(mnt) - before >= 5 * MiB
        assert _walked(mnt) == 2 * 4096

        # Another filesystem is not reported.
        assert [f for f in deleted_open_files({"/proc"}) if f.pid == holder.pid] == []
    finally:
        holder.communicate("", timeout=10)
        tricky.close()
    assert deleted_open_files({str(mnt)}) == []
    assert _used(mnt) - before < MiB


def test_other_users_processes_are_counted_not_fatal(tmpfs: Callable[[int], Path]) -> None:
    """As nobody, root's descriptors are off limits: counted in denied_pids, no exception.

    A forked child drops to uid 65534 (exec'ing the venv's python as nobody is not possible:
    it lives under /root).
    """
    mnt = tmpfs(64 * MiB)
    parent = os.getpid()
    device = os.stat(mnt).st_dev  # the child may not traverse root's 0700 tmp dir
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            result = scan_deleted_open_files([device], pids=[1, parent])
            os.write(write_end, f"{result.denied_pids} {len(result.files)}".encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        out = pipe.read()
    _, wait_status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    denied, found = (int(x) for x in out.split())
    assert denied == 2
    assert found == 0


def test_exited_pid_is_ignored(tmpfs: Callable[[int], Path]) -> None:
    mnt = tmpfs(64 * MiB)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    # A pid that no longer exists (reaped above): nothing, no error, not counted as denied.
    scan = scan_deleted_open_files([str(mnt)], pids=[gone.pid])
    assert (scan.files, scan.denied_pids) == ((), 0)
