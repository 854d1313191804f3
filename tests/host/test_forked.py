"""Work in a forked worker, streamed back: order, errors, an early close, a dead child, and a
worker forked before the threads that would make a fork unsafe."""

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

from diskguard.host.forked import ChildFailed, Claims, Worker, can_fork
from support.workerplan import forced_worker

# What the worker runs: module-level functions (the child finds them by name).

_STATE: dict[str, int] = {}


def numbered(n: int) -> Iterator[tuple[int, str, list[int]]]:
    return ((i, str(i), [i] * 3) for i in range(n))


def counting() -> Iterator[int]:
    return itertools.count()


def then_oserror() -> Iterator[int]:
    yield 1
    yield 2
    raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/gone/x.log")


def then_valueerror() -> Iterator[int]:
    yield 1
    raise ValueError("corrupt time index")


def then_killed() -> Iterator[int]:
    yield 1
    os.kill(os.getpid(), signal.SIGKILL)
    yield 2


def remembered(add: int) -> Iterator[int]:
    """State kept in the child between requests."""
    _STATE["n"] = _STATE.get("n", 0) + add
    yield _STATE["n"]


def pid() -> Iterator[int]:
    yield os.getpid()


@pytest.fixture
def worker() -> Iterator[Worker]:
    with forced_worker() as made:
        yield made


def test_items_come_back_in_order_across_chunks(worker: Worker) -> None:
    with contextlib.closing(worker.stream(numbered, 1000, chunk=7)) as items:
        assert list(items) == [(i, str(i), [i] * 3) for i in range(1000)]


def test_nothing_to_send_is_an_empty_stream(worker: Worker) -> None:
    assert list(worker.stream(numbered, 0)) == []


def test_one_child_serves_request_after_request_and_keeps_its_state(worker: Worker) -> None:
    """The worker is forked once: later requests run in the same child, which keeps what
    its modules hold (the age cache of a plan that walks twice)."""
    first = list(worker.stream(pid))
    assert first != [os.getpid()]
    assert list(worker.stream(remembered, 2)) == [2]
    assert list(worker.stream(remembered, 3)) == [5]
    assert list(worker.stream(pid)) == first
    assert "n" not in _STATE  # the parent's own state is untouched


def test_an_oserror_in_the_child_is_raised_again_after_the_items_before_it(
    worker: Worker,
) -> None:
    got: list[int] = []
    with pytest.raises(FileNotFoundError) as raised:
        got.extend(worker.stream(then_oserror, chunk=1))
    assert got == [1, 2]
    assert raised.value.filename == "/gone/x.log" and raised.value.errno == errno.ENOENT
    assert list(worker.stream(numbered, 3))[-1][0] == 2  # the worker goes on


def test_anything_else_the_child_raises_is_child_failed_with_its_text(worker: Worker) -> None:
    with pytest.raises(ChildFailed, match="ValueError: corrupt time index"):
        list(worker.stream(then_valueerror))


def test_closing_early_ends_the_request_not_the_worker(worker: Worker) -> None:
    stream = worker.stream(counting, chunk=16)
    assert list(itertools.islice(stream, 50)) == list(range(50))
    stream.close()
    stream.close()  # twice is fine
    assert list(worker.stream(numbered, 2)) == [(0, "0", [0] * 3), (1, "1", [1] * 3)]


def test_a_new_request_ends_the_one_not_read_to_its_end(worker: Worker) -> None:
    endless = worker.stream(counting, chunk=16)
    assert next(iter(endless)) == 0
    assert list(worker.stream(numbered, 1)) == [(0, "0", [0] * 3)]


def test_closing_the_worker_reaps_it(worker: Worker) -> None:
    child = worker.pid
    assert child is not None
    list(worker.stream(numbered, 1))
    worker.close()
    with pytest.raises(ChildProcessError):  # reaped: no zombie left behind
        os.waitpid(child, os.WNOHANG)
    with pytest.raises(ChildFailed, match="closed"):
        worker.stream(numbered, 1)
    worker.close()  # twice is fine


def test_a_child_killed_midway_is_an_error_not_a_short_answer(worker: Worker) -> None:
    with pytest.raises(ChildFailed, match="ended before"):
        list(worker.stream(then_killed, chunk=1))
    with pytest.raises(ChildFailed):
        list(worker.stream(numbered, 1))


def test_no_fork_while_another_thread_runs() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not can_fork()
        assert Worker.start() is None
    finally:
        stop.set()
        thread.join()


def test_a_worker_forked_first_serves_beside_threads_started_after() -> None:
    """What ``plan`` does with a broker configured: the worker is forked before the Kafka
    client's threads exist, and works while they run."""
    code = (
        "import threading\n"
        "from diskguard.host.forked import Worker, can_fork\n"
        "from diskguard.kafkalog.parallellisting import listed_plain\n"
        "worker = Worker.start()\n"
        "stop = threading.Event()\n"
        "threading.Thread(target=stop.wait).start()\n"
        "items = worker.stream(listed_plain, ['/', '/gone'], False, None, claims=2)\n"
        "print(can_fork(), len(list(items)))\n"
        "stop.set()\n"
    )
    assert _python(code).stdout == "False 2\n"


def test_output_buffered_before_the_fork_is_written_once() -> None:
    """The child leaves with os._exit: the parent's unflushed stdout is not flushed twice."""
    code = (
        "import sys\n"
        "sys.stdout.write('before ')\n"
        "from diskguard.host.forked import Worker\n"
        "from diskguard.kafkalog.parallellisting import listed_plain\n"
        "w = Worker.start()\n"
        "print(len(list(w.stream(listed_plain, ['/'], False, None, claims=1))))\n"
        "w.close()\n"
    )
    assert _python(code).stdout == "before 1\n"


def test_no_fork_when_the_process_may_run_on_one_core_only() -> None:
    """``taskset -c 0 diskguard plan``: a child would only take turns with its parent."""
    code = (
        "import os; os.sched_setaffinity(0, {0})\n"
        "from diskguard.host.forked import Worker, can_fork; print(can_fork(), Worker.start())"
    )
    assert _python(code).stdout == "False None\n"


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


def test_a_worker_whose_parent_dies_does_not_outlive_it() -> None:
    """The parent killed (SIGKILL, OOM) mid-request: its ends of the pipe and the socket
    close, the child's next send fails and it leaves; no orphan keeps working (or keeps a
    log dir's files open)."""
    code = (
        "import itertools, os, sys\n"
        "from diskguard.host.forked import Worker\n"
        "from diskguard.kafkalog.parallellisting import listed_plain\n"
        "w = Worker.start()\n"
        "stream = w.stream(listed_plain, ['/'] * 100000, False, None, chunk=16, claims=100000)\n"
        "next(iter(stream))\n"
        "print(w.pid, flush=True)\n"
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


def claimed(count: int, delay_s: float, claims: Claims) -> Iterator[int]:
    """Items from the front until this process's side is reached (``Claims``)."""
    for i in range(count):
        if not claims.front(i):
            return
        time.sleep(delay_s)
        yield i


@pytest.mark.parametrize(
    ("child_s", "own_s"),
    [(0.0, 0.001), (0.001, 0.0), (0.0005, 0.0005), (0.0, 0.0)],
    ids=["child-fast", "parent-fast", "even", "no-wait"],
)
def test_claims_from_both_ends_leave_no_item_undone(child_s: float, own_s: float) -> None:
    count = 300
    with forced_worker() as worker:
        stream = worker.stream(claimed, count, child_s, chunk=4, claims=count)
        assert stream.claims is not None
        mine = []
        for j in range(count - 1, -1, -1):
            if not stream.claims.back(j):
                break
            time.sleep(own_s)
            mine.append(j)
            stream.drain()
        theirs = list(stream)
    assert theirs == list(range(len(theirs)))  # a prefix, in order
    assert mine == list(range(count - 1, count - 1 - len(mine), -1))  # a suffix
    assert set(theirs) | set(mine) == set(range(count))


def test_claims_of_one_request_are_not_the_next_ones() -> None:
    """A child still working on a stream closed early must not move the next one's ends."""
    with forced_worker() as worker:
        first = worker.stream(claimed, 10_000, 0.0001, chunk=1, claims=10_000)
        next(iter(first))
        second = worker.stream(claimed, 50, 0.0, claims=50)
        assert list(second) == list(range(50))


def claimed_large(count: int, claims: Claims) -> Iterator[bytes]:
    """Items of 10 kB from the front: a few hundred fill the pipe (1 MiB)."""
    for i in range(count):
        if not claims.front(i):
            return
        yield bytes([i % 256]) * 10_000


def test_a_child_whose_pipe_is_full_goes_on_once_this_process_drains() -> None:
    """While this process does its end it takes what the child sent (``drain``): a child
    blocked on a full pipe (a million segments' bases fill it in ~200 dirs) would otherwise
    stop taking items until this process has done its own."""
    count = 600  # 6 MB: six pipes' worth
    with forced_worker() as worker:
        stream = worker.stream(claimed_large, count, chunk=8, claims=count)
        deadline = time.monotonic() + 120
        while not stream._over and time.monotonic() < deadline:
            stream.drain()
            time.sleep(0.001)
        assert stream._over, "the child did all its items while this process only drained"
        theirs = list(stream)
    assert [item[0] for item in theirs] == [i % 256 for i in range(count)]
