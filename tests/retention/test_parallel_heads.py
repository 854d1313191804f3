"""A plan dated on two cores is the plan dated on one: the same deletions in the same order,
the same warnings in the same order, none for heads only the child's look-ahead read."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diskguard.host import forked
from diskguard.host.forked import Worker
from diskguard.kafkalog import parallellisting
from diskguard.kafkalog.dating import AgeCache, SegmentFileReader
from diskguard.kafkalog.listing import ListingCache
from diskguard.kafkalog.model import Filesystem, FilesystemUsage
from diskguard.kafkalog.scan import scan_log_dir
from diskguard.kafkalog.topicpolicy import ProtectionRule
from diskguard.planstart import DATE_AHEAD
from diskguard.retention import parallelheads, planner
from diskguard.retention.limits import Limits, Standing, stand
from diskguard.retention.parallelheads import parallel_heads
from diskguard.retention.planner import Deletion, WalkTrace, plan_filesystem, with_facts
from support.configs import write_config
from support.kafkagen import SegmentSpec, write_partition
from support.workerplan import counting_plan, forced_worker

T0 = 1_700_000_000_000
MINUTE = 60_000


def _tree(root: Path) -> None:
    """Twelve partitions whose segments interleave in age, and the segments that make
    warnings: corrupt time indexes at a partition's first and later heads, a segment
    hard-linked from outside (its partition stops there), an unclean stop (log read), a
    missing ``.timeindex``."""
    for p in range(12):
        specs = [
            SegmentSpec(records=4, first_timestamp_ms=T0 + (s * 12 + (p * 5) % 12) * MINUTE)
            for s in range(6)
        ]
        write_partition(
            root,
            "orders" if p < 8 else "clicks",
            p % 8,
            specs,
            simulate_unclean_stop=[2] if p == 3 else False,
        )
    write_partition(root, "__consumer_offsets", 0, [SegmentSpec(records=4)] * 4)

    def seg(topic: str, p: int, k: int, sfx: str) -> Path:
        return root / f"{topic}-{p}" / f"{k * 4:020d}{sfx}"

    # Every partition's first two heads: whichever process dates a head, and whichever
    # heads a plan stops at, a warning says whether it was read in the right order (and
    # whether one that only the look-ahead read leaked).
    topics = [("orders", p) for p in range(8)] + [("clicks", p) for p in range(4)]
    first_heads = [(t, p, k) for t, p in topics for k in (0, 1)]
    later_heads = [("orders", 2, 2), ("clicks", 1, 4), ("orders", 6, 3)]
    for where in first_heads + later_heads:
        with open(seg(*where, ".timeindex"), "ab") as f:
            f.write(b"\x01\x02\x03")  # not a whole number of entries
    os.link(seg("orders", 4, 1, ".log"), root.parent / "backup.log")
    seg("orders", 5, 2, ".timeindex").unlink()


def _filesystem(root: Path) -> Filesystem:
    log_dir = scan_log_dir(str(root), "/data", ProtectionRule(assume_delete_policy=(".*",)))
    used = sum(st.st_blocks * 512 for st in map(os.lstat, _files(root)))
    return Filesystem(FilesystemUsage("/data", "/dev/x", used * 2, used, used), (log_dir,))


def _files(root: Path) -> list[str]:
    return [os.path.join(d, n) for d, _dirs, names in os.walk(root) for n in names]


def _plan(
    fs: Filesystem,
    limit: float,
    parallel: bool,
    ages: AgeCache | None = None,
    **kw: object,
) -> tuple[list[Deletion], list[str]]:
    """One plan of ``fs`` on one core, or on two with a worker forked for it (the test
    process may hold other threads: forked all the same, as a plan forks before its own)."""
    reader = SegmentFileReader(ages)
    with contextlib.ExitStack() as stack:
        worker = stack.enter_context(forced_worker()) if parallel else None
        heads = parallel_heads(reader, worker, 0) if parallel else parallelheads.LocalHeads
        _fs_plan, chosen = plan_filesystem(fs, Limits(limit, limit), reader, heads=heads, **kw)  # type: ignore[arg-type]
    return chosen, reader.warnings


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many requests the plans sent a worker (each must really have used one)."""
    made: list[int] = []
    real = forked.Worker.stream

    def counting(self: forked.Worker, *a: object, **kw: object) -> forked.WorkStream:
        made.append(1)
        return real(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(forked.Worker, "stream", counting)
    return made


@pytest.mark.parametrize("limit", [49.9, 49.0, 47.0, 45.0, 40.0, 30.0, 10.0, 0.0])
def test_two_cores_plan_what_one_plans(tmp_path: Path, limit: float, forks: list[int]) -> None:
    root = tmp_path / "logs"
    _tree(root)
    fs = _filesystem(root)
    one = _plan(fs, limit, parallel=False)
    two = _plan(fs, limit, parallel=True)
    assert two[0] == one[0]
    assert two[1] == one[1]
    assert forks == [1]
    assert one[0], "the limit leaves something to delete"


def test_the_look_ahead_reports_nothing_the_plan_did_not_read(tmp_path: Path) -> None:
    """A small excess: the child dates far past what the plan takes, over corrupt indexes
    the one-core plan never opens; none of their warnings may show."""
    root = tmp_path / "logs"
    _tree(root)
    fs = _filesystem(root)
    chosen, warnings = _plan(fs, 49.9, parallel=True)
    assert len(chosen) <= 3
    assert warnings == _plan(fs, 49.9, parallel=False)[1]
    assert not any(
        "clicks-1/00000000000000000016" in w or "orders-6/00000000000000000012" in w
        for w in warnings
    )


def test_consumer_offsets_and_leadership_order_both_alike(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    _tree(root)
    fs = _filesystem(root)
    committed = {("orders", p): {"billing": 9, "audit": 2} for p in range(8)}
    led_here = {("orders", p) for p in range(0, 8, 2)} | {("clicks", 0)}
    for limit in (45.0, 20.0):
        one = _plan(fs, limit, parallel=False, committed=committed, led_here=led_here)
        two = _plan(fs, limit, parallel=True, committed=committed, led_here=led_here)
        assert two == one
        assert any(d.unconsumed_records for d in one[0])


@pytest.mark.parametrize("remember", ["dated", "ages"])
@pytest.mark.parametrize("limit", [47.0, 30.0, 0.0])
def test_a_broker_mode_plan_walks_twice_on_two_cores_as_on_one(
    tmp_path: Path, limit: float, remember: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broker mode plans twice, the second time knowing offsets and leaders, each process
    remembering the first walk (the plan command what it read, ``dated``; the daemon an age
    cache; the worker what it read): the second plan and its warnings are one core's,
    whatever the first walk and the worker's look-ahead dated. Remembering what it read,
    one core's second walk reads no file."""
    root = tmp_path / "logs"
    _tree(root)
    fs = _filesystem(root)
    committed = {("orders", p): {"billing": 9, "audit": 2} for p in range(8)}
    led_here = {("orders", p) for p in range(0, 8, 2)} | {("clicks", 0)}
    files_read: list[int] = []
    real = SegmentFileReader._dated

    def counted(self: SegmentFileReader, partition: object, base: int) -> object:
        files_read[-1] += 1
        return real(self, partition, base)  # type: ignore[arg-type]

    monkeypatch.setattr(SegmentFileReader, "_dated", counted)

    def twice(worker: Worker | None) -> tuple[list[Deletion], list[str]]:
        ages, dated = AgeCache(), {}  # type: ignore[var-annotated]
        for facts in ({}, {"committed": committed, "led_here": led_here}):
            files_read.append(0)
            reader = (
                SegmentFileReader(None, dated) if remember == "dated" else SegmentFileReader(ages)
            )
            heads = parallel_heads(reader, worker, 0) if worker else parallelheads.LocalHeads
            _fs, chosen = plan_filesystem(fs, Limits(limit, limit), reader, heads=heads, **facts)  # type: ignore[arg-type]
        return chosen, reader.warnings

    one = twice(None)
    assert files_read[0] > 0 and (files_read[1] == 0) == (remember == "dated")
    with forced_worker() as worker:
        two = twice(worker)
    assert two == one
    assert one[0] and one[1]


def test_a_failure_in_the_child_fails_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "logs"
    _tree(root)
    fs = _filesystem(root)
    real = SegmentFileReader.__call__
    calls = {"n": 0}

    def failing(self: SegmentFileReader, partition: object, base: int) -> object:
        calls["n"] += 1
        if os.getpid() != parent and calls["n"] > 3:
            raise PermissionError(13, "Permission denied", f"{partition.path}/x")  # type: ignore[attr-defined]
        return real(self, partition, base)  # type: ignore[arg-type]

    parent = os.getpid()
    monkeypatch.setattr(SegmentFileReader, "__call__", failing)
    with pytest.raises(PermissionError, match="Permission denied"):
        _plan(fs, 0.0, parallel=True)


def test_the_plan_command_forks_for_a_large_log_dir_and_says_the_same(tmp_path: Path) -> None:
    """``diskguard plan --json`` over 300 partitions lists and dates on two cores (one
    request to its worker each); with the thresholds out of reach it sends none and prints
    the same plan."""
    root = tmp_path / "logs"
    for p in range(300):
        spec = SegmentSpec(records=2, first_timestamp_ms=T0 + (p * 7919) % 1000 * MINUTE)
        write_partition(root, f"t{p % 3}", p // 3, [spec] * 3)
    (root / "t0-0" / f"{0:020d}.timeindex").write_bytes(b"\x01")  # a warning, on stderr
    config = write_config(tmp_path, root, disk_usage_percent=1.0)
    two, one = counting_plan(config), counting_plan(config, thresholds=False)
    assert two.returncode == one.returncode == 0, two.stderr + one.stderr
    assert two.stderr.endswith("requests=2\n") and one.stderr.endswith("requests=0\n")
    got, want = json.loads(two.stdout), json.loads(one.stdout)
    for deletion in got["deletions"] + want["deletions"]:
        # The usage the plan saw moves with the disk (the suite may share it with others).
        for key in ("usage_percent", "excess_bytes", "predicted_usage_percent"):
            deletion["why"].pop(key)
    assert got["deletions"] == want["deletions"] and len(want["deletions"]) == 600
    # The rest but what the disk's usage moves (the suite may share the disk with others).
    moving = {"used_bytes", "available_bytes", "usage_percent", "excess_bytes"}
    moving |= {"unreachable_bytes", "predicted_used_bytes", "predicted_usage_percent"}
    for plan in (got, want):
        del plan["deletions"]
        for fs in plan["filesystems"]:
            for key in moving:
                fs.pop(key, None)
    assert got == want
    assert two.stderr == one.stderr.replace("requests=0", "requests=2")
    assert "t0-0/00000000000000000000.timeindex" in one.stderr


@pytest.mark.parametrize("led", ["all", "some"])
def test_a_traced_walk_on_two_cores_gives_the_facts_as_a_second_walk_on_one(
    tmp_path: Path, led: str
) -> None:
    """Broker mode's one-shot plan gives the first walk the broker's facts without walking
    again (``with_facts``) where its ties allow it: the child says which of its heads had a
    rival as old. Twelve partitions whose heads tie in threes, read by a group to the end:
    with every partition led here no fact touches a tie, and the plan is the second walk's;
    with some led elsewhere the ties are theirs, and it declines (the caller walks again)."""
    root = tmp_path / "logs"
    for p in range(12):
        specs = [
            SegmentSpec(records=4, first_timestamp_ms=T0 + (s * 3 + p % 3) * MINUTE)
            for s in range(5)
        ]
        write_partition(root, "orders" if p < 8 else "clicks", p % 8, specs)
    fs = _filesystem(root)
    names = [("orders", p) for p in range(8)] + [("clicks", p) for p in range(4)]
    # Read to the end (no head unconsumed): the facts that could reorder a tie are the leaders.
    committed = {("orders", p): {"billing": 20} for p in range(8)}
    led_here = set(names) if led == "all" else set(names[::2])
    limits = Limits(40.0, 40.0)

    def standing_of(fs: Filesystem) -> Standing:
        return stand(fs.usage, limits, fs.pending_reclaim_bytes)

    second = planner.plan([fs], standing_of, SegmentFileReader(), committed, led_here)
    trace = WalkTrace()
    with forced_worker() as worker:
        heads = parallel_heads(SegmentFileReader(None, {}), worker, 0)
        first = planner.plan(
            [fs], standing_of, SegmentFileReader(None, {}), heads=heads, trace=trace
        )
    same = with_facts(first, trace, standing_of, committed, led_here)
    assert len(second.deletions) > 12
    if led == "all":
        assert same == second
    else:
        assert same is None


def dated_ahead_count() -> Iterator[int]:
    """In the worker: how many heads it has dated (ahead, or in a walk)."""
    yield len(parallelheads._WORKER_DATED)


@pytest.mark.parametrize("limit", [49.9, 47.0, 40.0, 10.0])
@pytest.mark.parametrize("share", ["all", "some"])
def test_heads_dated_ahead_plan_what_one_core_plans(
    tmp_path: Path, limit: float, share: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan command's way: the worker lists from one end (``parallellisting``), dates
    its listings' heads ahead while this process scans (``date_ahead``), then walks those
    partitions from what it dated: the deletions and the warnings (their order too) of
    one core, none from a head only the dating ahead read."""
    root = tmp_path / "logs"
    _tree(root)
    one = _plan(_filesystem(root), limit, parallel=False)
    monkeypatch.setattr(parallellisting, "MIN_DIRS", 0)
    with forced_worker() as worker:
        cache = ListingCache.started([str(root)], False, worker, DATE_AHEAD)
        # This process lets the worker list them all (it would meet it halfway otherwise,
        # or list them all itself first: 13 dirs), so that the worker walks them all.
        stream = cache._early._stream  # type: ignore[union-attr]
        deadline = time.monotonic() + 120
        while not stream._over and time.monotonic() < deadline:  # type: ignore[union-attr]
            stream.drain()  # type: ignore[union-attr]
            time.sleep(0.01)
        log_dir = scan_log_dir(
            str(root), "/data", ProtectionRule(assume_delete_policy=(".*",)), cache=cache
        )
        assert len(cache.listed_by_worker) == 13, "the worker listed every dir"
        dated = list(worker.stream(dated_ahead_count))
        assert dated[0] >= 4, "the worker dated heads before the walk asked for any"
        used = sum(st.st_blocks * 512 for st in map(os.lstat, _files(root)))
        fs = Filesystem(FilesystemUsage("/data", "/dev/x", used * 2, used, used), (log_dir,))
        reader = SegmentFileReader()
        ahead = sorted(cache.listed_by_worker)
        # "some": as if this process had listed the others (it walks some of those).
        heads = parallel_heads(
            reader, worker, 0, dated_ahead=ahead if share == "all" else ahead[::2]
        )
        _fs_plan, chosen = plan_filesystem(fs, Limits(limit, limit), reader, heads=heads)
    assert (chosen, reader.warnings) == one
    assert one[0], "the limit leaves something to delete"
