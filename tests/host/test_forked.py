"""Work in a forked child, streamed back: order, errors, an early close, a dead child."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from diskguard.host.forked import ChildFailed, ForkedStream, can_fork


def test_items_come_back_in_order_across_chunks() -> None:
    stream = ForkedStream(lambda: ((i, str(i), [i] * 3) for i in range(1000)), chunk=7)
    with contextlib.closing(stream) as items:
        assert list(items) == [(i, str(i), [i] * 3) for i in range(1000)]


def test_nothing_to_send_is_an_empty_stream() -> None:
    assert list(ForkedStream(lambda: iter(()))) == []


def test_an_oserror_in_the_child_is_raised_again_after_the_items_before_it() -> None:
    def produce() -> Iterator[int]:
        yield 1
        yield 2
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/gone/x.log")

    got: list[int] = []
    with pytest.raises(FileNotFoundError) as raised:
        got.extend(ForkedStream(produce, chunk=1))
    assert got == [1, 2]
    assert raised.value.filename == "/gone/x.log" and raised.value.errno == errno.ENOENT


def test_anything_else_the_child_raises_is_child_failed_with_its_text() -> None:
    def produce() -> Iterator[int]:
        yield 1
        raise ValueError("corrupt time index")

    with pytest.raises(ChildFailed, match="ValueError: corrupt time index"):
        list(ForkedStream(produce))


def test_closing_early_ends_a_child_that_would_run_forever() -> None:
    stream = ForkedStream(lambda: itertools.count(), chunk=16)
    pid = stream._pid
    assert pid is not None
    assert list(itertools.islice(stream, 50)) == list(range(50))
    stream.close()
    with pytest.raises(ChildProcessError):  # reaped: no zombie left behind
        os.waitpid(pid, os.WNOHANG)
    stream.close()  # twice is fine


def test_a_child_killed_midway_is_an_error_not_a_short_answer() -> None:
    def produce() -> Iterator[int]:
        yield 1
        os.kill(os.getpid(), signal.SIGKILL)
        yield 2

    with pytest.raises(ChildFailed, match="ended before"):
        list(ForkedStream(produce, chunk=1))


def test_no_fork_while_another_thread_runs() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not can_fork()
    finally:
        stop.set()
        thread.join()


def test_output_buffered_before_the_fork_is_written_once() -> None:
    """The child leaves with os._exit: the parent's unflushed stdout is not flushed twice."""
    code = (
        "import sys\n"
        "sys.stdout.write('before ')\n"
        "from diskguard.host.forked import ForkedStream\n"
        "print(list(ForkedStream(lambda: [1, 2])))\n"
    )
    assert _python(code).stdout == "before [1, 2]\n"


def test_no_fork_when_the_process_may_run_on_one_core_only() -> None:
    """``taskset -c 0 diskguard plan``: a child would only take turns with its parent."""
    code = (
        "import os; os.sched_setaffinity(0, {0})\n"
        "from diskguard.host.forked import can_fork; print(can_fork())"
    )
    assert _python(code).stdout == "False\n"


def test_no_fork_while_a_thread_python_does_not_know_of_runs() -> None:
    """A library's native thread (librdkafka's, say) holds locks the child may need too."""
    code = (
        "import ctypes, ctypes.util, threading\n"
        "libc = ctypes.CDLL(ctypes.util.find_library('c'))\n"
        "sleep = ctypes.cast(libc.sleep, ctypes.c_void_p)  # C all along: Python never sees it\n"
        "tid = ctypes.c_ulong()\n"
        "assert libc.pthread_create(ctypes.byref(tid), None, sleep, ctypes.c_void_p(5)) == 0\n"
        "from diskguard.host.forked import can_fork\n"
        "print(threading.active_count(), can_fork())\n"
    )
    # threading sees one thread; the process has two
    assert _python(code).stdout == "1 False\n"


def test_a_child_whose_parent_dies_does_not_outlive_it() -> None:
    """The parent killed (SIGKILL, OOM): its end of the pipe closes, the child's next send
    fails and it leaves; no orphan keeps working (or keeps a log dir's files open)."""
    code = (
        "import itertools, os, sys\n"
        "from diskguard.host.forked import ForkedStream\n"
        "stream = ForkedStream(lambda: itertools.count(), chunk=16)\n"
        "next(iter(stream))\n"
        "print(stream._pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = _python(code, check=False)
    assert out.returncode == -signal.SIGKILL
    child = int(out.stdout)
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _python(code: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter: one thread, nothing forked before it."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=check, timeout=60
    )
