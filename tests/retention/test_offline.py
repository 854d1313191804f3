"""The offline executor on real loop-mounted ext4 with real Kafka segment files (kafkagen):
bytes freed as df sees them, a ``.lock`` held by another process, kill -9 at every kind of
step followed by ``recover``, and the guard rails (active segment, stale plan, symlinks out
of the log dir, holes, a full disk)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from diskguard.kafkalog.listing import ListingCache
from diskguard.retention.audit import AuditLog, pair_actions, read_audit
from diskguard.retention.offline import fileexecutor
from diskguard.retention.offline.fileexecutor import FileExecutor
from diskguard.retention.offline.journal import JOURNAL_FILE
from diskguard.retention.offline.removal import SegmentRemover
from diskguard.retention.offline.sweep import Sweeper
from diskguard.retention.planner import Deletion
from support.disks import files_under
from support.kafkagen import PartitionLayout, SegmentLayout, SegmentSpec, hold_lock, write_log_dir

MiB = 1024 * 1024
SEG = SegmentSpec(records=40, payload_size=3000, records_per_batch=4)


def make_log_dir(root: Path, partitions: int = 2, segments: int = 4) -> dict[int, PartitionLayout]:
    layout = write_log_dir(
        root,
        {("orders", p): [SEG] * segments for p in range(partitions)},
        segment_index_bytes=MiB,
    )
    return {p: layout.partitions[("orders", p)] for p in range(partitions)}


def allocated(paths: Iterable[Path]) -> int:
    return sum(os.lstat(p).st_blocks * 512 for p in paths if os.path.lexists(p))


def deletion(log_dir: Path, mount: Path, part: PartitionLayout, seg: SegmentLayout) -> Deletion:
    files = tuple(str(p) for p in seg.files if p.exists())
    return Deletion(
        log_dir=str(log_dir),
        topic=part.topic,
        partition=part.partition,
        base_offset=seg.base_offset,
        next_offset=seg.next_offset,
        max_timestamp_ms=seg.max_timestamp_ms,
        bytes=allocated(Path(f) for f in files),
        files=files,
        mount=str(mount),
    )


def df_free(mount: Path) -> int:
    os.sync()
    st = os.statvfs(mount)
    return st.f_bavail * st.f_frsize


def executor(state: Path, **kwargs: object) -> FileExecutor:
    return FileExecutor(state, AuditLog(state / "audit.jsonl"), **kwargs)  # type: ignore[arg-type]


def segment_names(d: Deletion) -> set[str]:
    return {f"orders-{d.partition}/{os.path.basename(f)}" for f in d.files}


def test_deletes_exactly_the_chosen_segments_and_df_sees_the_bytes(
    loop_ext4: Callable[..., Path],
) -> None:
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs)
    chosen = [
        deletion(logs, mnt, parts[0], parts[0].segments[0]),
        deletion(logs, mnt, parts[1], parts[1].segments[0]),
        deletion(logs, mnt, parts[0], parts[0].segments[1]),
    ]
    before = files_under(logs)
    state.mkdir()
    audit = AuditLog(state / "audit.jsonl")
    assert audit.ensure_reserve()  # its 1 MiB is taken once, before the first deletion
    free_before = df_free(mnt)

    results = FileExecutor(state, audit).execute(chosen, {str(mnt): 91.5})

    assert [r.ok for r in results] == [True, True, True], results
    assert [r.deletion for r in results] == chosen
    assert all(r.mode == "offline" and r.error is None for r in results)
    freed = sum(r.freed_bytes for r in results)
    assert freed == sum(d.bytes for d in chosen) > 0
    # df: everything freed is visible; the audit/journal lines cost at most a few blocks.
    gained = df_free(mnt) - free_before
    assert freed - 64 * 1024 <= gained <= freed + 64 * 1024
    gone = set().union(*(segment_names(d) for d in chosen))
    after = files_under(logs)
    assert set(before) - set(after) == gone
    assert {k: v for k, v in before.items() if k not in gone} == after  # same inodes
    assert not [k for k in after if k.endswith(".deleted")]
    assert (state / JOURNAL_FILE).stat().st_size == 0
    lines = list(read_audit(state / "audit.jsonl"))
    actions = pair_actions(lines)
    assert len(actions) == 3
    for action, d, r in zip(actions, chosen, results, strict=True):
        assert action.intent is not None and action.outcome is not None
        assert action.intent["phase"] == "intent" and action.outcome["phase"] == "done"
        assert action.intent["base_offset"] == d.base_offset
        assert action.intent["usage_before_percent"] == 91.5
        assert action.outcome["freed_bytes"] == r.freed_bytes


def test_a_log_dir_locked_by_another_process_is_never_touched(
    loop_ext4: Callable[..., Path],
) -> None:
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs)
    chosen = [deletion(logs, mnt, parts[p], parts[p].segments[0]) for p in (0, 1)]
    before = files_under(logs)
    with hold_lock(logs) as pid:
        results = executor(state).execute(chosen, {})
        assert files_under(logs) == before
    assert [r.ok for r in results] == [False, False]
    for r in results:
        assert r.refused and ".lock" in (r.error or "") and str(pid) in (r.error or "")
    assert all(r.freed_bytes == 0 for r in results)
    phases = [line["phase"] for line in read_audit(state / "audit.jsonl")]
    assert phases == ["refused", "refused"]


def test_refuses_the_active_segment_and_a_stale_plan(loop_ext4: Callable[..., Path]) -> None:
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=1)
    part = parts[0]
    active = deletion(logs, mnt, part, part.active)
    # A plan made before segment 1 was deleted by someone else and segment 2 rolled: the
    # "next offset" skips a segment that exists on disk.
    skipping = dataclasses.replace(
        deletion(logs, mnt, part, part.segments[0]), next_offset=part.segments[2].base_offset
    )
    before = files_under(logs)
    results = executor(state).execute([active], {})
    results += executor(state).execute([skipping], {})
    assert files_under(logs) == before
    assert [r.refused for r in results] == [True, True]
    assert "active" in (results[0].error or "")
    assert "lies between" in (results[1].error or "")


def test_never_follows_a_symlink_out_of_the_log_dir(loop_ext4: Callable[..., Path]) -> None:
    mnt = loop_ext4(64 * MiB)
    logs, state, outside = mnt / "logs", mnt / "state", mnt / "outside"
    parts = make_log_dir(logs, partitions=1)
    foreign = make_log_dir(outside, partitions=2)
    # 1. A partition dir that is a symlink to a dir outside the log dir.
    os.symlink(outside / "orders-1", logs / "orders-1")
    via_link = deletion(logs, mnt, foreign[1], foreign[1].segments[0])
    via_link = dataclasses.replace(
        via_link, files=tuple(str(logs / "orders-1" / os.path.basename(f)) for f in via_link.files)
    )
    # 2. Files named in the plan that live outside the partition dir.
    elsewhere = dataclasses.replace(
        deletion(logs, mnt, parts[0], parts[0].segments[0]),
        files=tuple(str(p) for p in foreign[0].segments[0].files),
    )
    # 3. A segment file that is itself a symlink out of the log dir.
    seg1 = parts[0].segments[1]
    target = foreign[0].segments[1].index_path
    os.unlink(seg1.index_path)
    os.symlink(target, seg1.index_path)
    linked_file = deletion(logs, mnt, parts[0], seg1)
    outside_before, logs_before = files_under(outside), files_under(logs)

    results = executor(state).execute([via_link, elsewhere], {})
    results += executor(state).execute([linked_file], {})

    assert [r.refused for r in results] == [True, True, True], results
    assert "symlink" in (results[0].error or "")
    assert "not inside" in (results[1].error or "")
    assert "not a regular file" in (results[2].error or "")
    assert files_under(outside) == outside_before
    assert files_under(logs) == logs_before
    assert target.stat().st_size > 0


def test_after_a_failed_segment_later_ones_of_that_partition_are_refused(
    loop_ext4: Callable[..., Path],
) -> None:
    """Deleting segment 1 after segment 0 failed would leave a hole in the partition."""
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs)
    first = deletion(logs, mnt, parts[0], parts[0].segments[0])
    second = deletion(logs, mnt, parts[0], parts[0].segments[1])
    other = deletion(logs, mnt, parts[1], parts[1].segments[0])
    # Segment 0's .timeindex replaced by a directory: not a regular file -> refused.
    ti = parts[0].segments[0].timeindex_path
    os.unlink(ti)
    ti.mkdir()
    results = executor(state).execute([first, second, other], {})
    assert [r.ok for r in results] == [False, False, True]
    assert "hole" in (results[1].error or "")
    assert parts[0].segments[1].log_path.exists()
    assert not parts[1].segments[0].log_path.exists()


def test_a_file_vanished_since_planning_counts_zero(loop_ext4: Callable[..., Path]) -> None:
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=1)
    seg = parts[0].segments[0]
    d = deletion(logs, mnt, parts[0], seg)
    expected = allocated([seg.log_path, seg.index_path])
    seg.timeindex_path.unlink()
    [result] = executor(state).execute([d], {})
    assert result.ok and result.freed_bytes == expected
    assert not seg.log_path.exists() and not seg.index_path.exists()


def test_a_missing_log_dir_is_refused_not_raised(tmp_path: Path) -> None:
    gone = tmp_path / "no-such-log-dir"
    d = Deletion(str(gone), "orders", 0, 0, 10, 0, 100, (str(gone / "orders-0" / "x.log"),), "/")
    [result] = executor(tmp_path / "state").execute([d], {})
    assert result.refused and "cannot lock" in (result.error or "")
    assert not gone.exists()


# ----------------------------------------------------------------------------- kill -9

_CHILD = r"""
import json, os, signal, sys
from pathlib import Path
from diskguard.retention.audit import AuditLog
from diskguard.retention.offline.fileexecutor import FileExecutor
from diskguard.retention.planner import Deletion

state, kill_at, spec = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
deletions = [Deletion(**{**d, "files": tuple(d["files"])}) for d in json.loads(spec.read_text())]
steps = []

def on_step(name):
    steps.append(name)
    if len(steps) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

FileExecutor(state, AuditLog(state / "audit.jsonl"), on_step=on_step).execute(deletions, {})
"""


def _segment_state(root: Path, d: Deletion) -> str:
    names = [os.path.basename(f) for f in d.files]
    part = root / f"orders-{d.partition}"
    present = [os.path.lexists(part / n) for n in names]
    renamed = [os.path.lexists(part / (n + ".deleted")) for n in names]
    if all(present) and not any(renamed):
        return "whole"
    if not any(present) and not any(renamed):
        return "gone"
    return "partial"


def test_kill_9_at_any_step_then_recover_leaves_no_half_deleted_segment(
    loop_ext4: Callable[..., Path], tmp_path: Path
) -> None:
    mnt = loop_ext4(64 * MiB)

    def scenario(i: int) -> tuple[Path, Path, list[Deletion]]:
        logs, state = mnt / f"run{i}" / "logs", mnt / f"run{i}" / "state"
        parts = make_log_dir(logs, partitions=2, segments=3)
        chosen = [
            deletion(logs, mnt, parts[0], parts[0].segments[0]),
            deletion(logs, mnt, parts[1], parts[1].segments[0]),
            deletion(logs, mnt, parts[0], parts[0].segments[1]),
        ]
        return logs, state, chosen

    # Count the steps of an uninterrupted run (in process).
    steps: list[str] = []
    logs, state, chosen = scenario(0)
    assert all(r.ok for r in executor(state, on_step=steps.append).execute(chosen, {}))
    total = len(steps)
    assert total >= 20
    kill_points = sorted(random.Random(61).sample(range(1, total + 1), 20))

    for i, kill_at in enumerate(kill_points, start=1):
        logs, state, chosen = scenario(i)
        before = files_under(logs)
        spec = tmp_path / f"spec{i}.json"
        spec.write_text(json.dumps([dataclasses.asdict(d) for d in chosen]))
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(state), str(kill_at), str(spec)],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == -signal.SIGKILL, (kill_at, proc.stderr.decode()[-2000:])
        where = f"killed at step {kill_at} ({steps[kill_at - 1]})"

        recovered = executor(state).recover([logs])
        # Finished, or (killed before the first rename) cancelled: kept whole, re-planned.
        assert all(
            r.ok or (r.refused and "interrupted before" in (r.error or "")) for r in recovered
        ), (where, recovered)
        states = [_segment_state(logs, d) for d in chosen]
        # Never half-deleted; deleted in order (a prefix of the plan).
        assert "partial" not in states, (where, states)
        assert states == sorted(states, key=lambda s: s != "gone"), (where, states)
        assert executor(state).pending() == 0

        # The next cycle re-plans what is still there and finishes: exactly the chosen go.
        remaining = [d for d, s in zip(chosen, states, strict=True) if s == "whole"]
        assert all(r.ok for r in executor(state).execute(remaining, {}))
        gone = set().union(*(segment_names(d) for d in chosen))
        after = files_under(logs)
        assert set(before) - set(after) == gone, where
        assert {k: v for k, v in before.items() if k not in gone} == after, where
        # The audit log stays parseable; every intent has an outcome: a success, or the
        # cancellation of a deletion killed before it touched a file.
        actions = pair_actions(list(read_audit(state / "audit.jsonl")))
        assert all(
            a.outcome is not None
            and (
                a.outcome["phase"] == "done" or "interrupted before" in str(a.outcome.get("error"))
            )
            for a in actions
        ), where


# ----------------------------------------------------------------------------- recover


class Crash(BaseException):
    """Stands in for the process dying: nothing in the executor catches it."""


def test_the_next_execute_in_that_log_dir_finishes_a_crashed_deletion(
    loop_ext4: Callable[..., Path],
) -> None:
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs)
    first = deletion(logs, mnt, parts[0], parts[0].segments[0])
    second = deletion(logs, mnt, parts[1], parts[1].segments[0])
    before = files_under(logs)

    def crash(step: str) -> None:
        if step.startswith("rename:") and step.endswith(".index"):
            raise Crash(step)

    with pytest.raises(Crash):
        executor(state, on_step=crash).execute([first], {})
    assert executor(state).pending() == 1
    assert _segment_state(logs, first) == "partial"

    assert [r.ok for r in executor(state).execute([second], {})] == [True]
    gone = segment_names(first) | segment_names(second)
    after = files_under(logs)
    assert set(before) - set(after) == gone
    assert {k: v for k, v in before.items() if k not in gone} == after
    assert executor(state).pending() == 0
    assert not [k for k in after if k.endswith(".deleted")]


def _journal(state: Path, entries: Sequence[dict[str, object]]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    with open(state / JOURNAL_FILE, "w") as fh:
        for entry in entries:
            fh.write(json.dumps(entry) + "\n")


def test_recover_touches_only_what_the_journal_names(loop_ext4: Callable[..., Path]) -> None:
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=1)
    part_dir = str(logs / "orders-0")
    seg0, seg1 = parts[0].segments[0], parts[0].segments[1]
    # A crash after renaming seg0's .log: the rest of its files still there.
    os.rename(seg0.log_path, str(seg0.log_path) + ".deleted")
    fields = {"topic": "orders", "partition": 0, "base_offset": 0, "next_offset": 1}
    _journal(
        state,
        [
            {
                "op": "intent",
                "action_id": "a1",
                "log_dir_real": str(logs),
                "partition_dir": part_dir,
                "names": [seg0.log_path.name, seg0.index_path.name, seg0.timeindex_path.name],
                "fields": fields,
            },
            # Damaged/malicious entries: names that are not segment files, a dir outside.
            {
                "op": "intent",
                "action_id": "a2",
                "log_dir_real": str(logs),
                "partition_dir": part_dir,
                "names": ["leader-epoch-checkpoint", seg1.log_path.name],
                "fields": fields,
            },
            {
                "op": "intent",
                "action_id": "a3",
                "log_dir_real": str(logs),
                "partition_dir": str(mnt / "elsewhere" / "orders-0"),
                "names": [seg1.index_path.name],
                "fields": fields,
            },
        ],
    )
    (state / JOURNAL_FILE).open("a").write('{"op": "intent", "action_id": "torn", "nam')
    before = files_under(logs)
    results = executor(state).recover([logs])
    assert [r.ok for r in results] == [True, False, False]
    gone = {f"orders-0/{seg0.log_path.name}.deleted", f"orders-0/{seg0.index_path.name}"}
    gone.add(f"orders-0/{seg0.timeindex_path.name}")
    after = files_under(logs)
    assert set(before) - set(after) == gone
    assert {k: v for k, v in before.items() if k not in gone} == after
    assert executor(state).pending() == 0


def test_recover_abandons_when_a_broker_got_the_lock_first(loop_ext4: Callable[..., Path]) -> None:
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=1)
    seg0 = parts[0].segments[0]
    _journal(
        state,
        [
            {
                "op": "intent",
                "action_id": "a1",
                "log_dir_real": str(logs),
                "partition_dir": str(logs / "orders-0"),
                "names": [seg0.log_path.name],
                "fields": {"topic": "orders", "partition": 0},
            }
        ],
    )
    before = files_under(logs)
    with hold_lock(logs):
        [result] = executor(state).recover([logs])
        assert files_under(logs) == before
    assert not result.ok and "abandoned" in (result.error or "")
    assert executor(state).pending() == 0


def test_recover_rechecks_a_segment_whose_log_was_not_renamed_yet(
    loop_ext4: Callable[..., Path],
) -> None:
    """Crash before the ``.log`` rename, then a broker ran (and e.g. the topic was re-created):
    the journal's segment is now the ACTIVE one and must not be deleted. (Nothing of it was
    renamed, so recovery cancels the entry without even looking further.)"""
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=1, segments=1)
    active = parts[0].active
    names = [active.log_path.name, active.index_path.name]
    fields = {"topic": "orders", "partition": 0, "base_offset": 0, "next_offset": 500}
    _journal(
        state,
        [
            {
                "op": "intent",
                "action_id": "a1",
                "log_dir_real": str(logs),
                "partition_dir": str(logs / "orders-0"),
                "names": names,
                "fields": fields,
            }
        ],
    )
    before = files_under(logs)
    [result] = executor(state).recover([logs])
    assert not result.ok and "kept" in (result.error or "")
    assert files_under(logs) == before
    assert executor(state).pending() == 0


def test_recover_can_sweep_leftover_deleted_segment_files(loop_ext4: Callable[..., Path]) -> None:
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=1)
    seg0 = parts[0].segments[0]
    leftover = Path(str(seg0.log_path) + ".deleted")
    os.rename(seg0.log_path, leftover)
    unrelated = logs / "orders-0" / "notes.deleted"
    unrelated.write_text("not a segment file")
    executor(state).recover([logs])
    assert leftover.exists()  # off by default
    executor(state).recover([logs], sweep_deleted=True)
    assert not leftover.exists()
    assert unrelated.exists()


def test_recover_sweeps_only_the_given_partition_dirs(loop_ext4: Callable[..., Path]) -> None:
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=2)
    left = [Path(str(p.segments[0].log_path) + ".deleted") for p in (parts[0], parts[1])]
    for p, leftover in zip((parts[0], parts[1]), left, strict=True):
        os.rename(p.segments[0].log_path, leftover)
    outside = mnt / "elsewhere-0"
    outside.mkdir()
    stray = outside / (parts[0].segments[0].log_path.name + ".deleted")
    stray.write_text("outside the log dir")
    executor(state).recover([logs], sweep_paths=[])
    assert all(p.exists() for p in left)  # nothing listed: nothing swept
    executor(state).recover([logs], sweep_paths=[left[0].parent, outside])
    assert not left[0].exists()
    assert left[1].exists()  # not named: not swept
    assert stray.exists()  # not inside a configured log dir: refused


def test_the_kraft_metadata_log_is_never_swept(loop_ext4: Callable[..., Path]) -> None:
    """``__cluster_metadata-0`` holds ``*.deleted`` segments a KRaft broker removes itself
    (older than its newest snapshot): neither sweep touches them, whether it lists every
    partition dir or is given the dirs a scan saw them in."""
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    make_log_dir(logs, partitions=1)
    meta = logs / "__cluster_metadata-0"
    meta.mkdir()
    leftover = meta / "00000000000000000000.log.deleted"
    leftover.write_bytes(b"x" * 4096)
    (meta / "00000000000000000017-0000000001.checkpoint.deleted").write_bytes(b"y")
    before = files_under(meta)
    executor(state).recover([logs], sweep_deleted=True)
    executor(state).recover([logs], sweep_paths=[meta])
    assert files_under(meta) == before


def test_sweep_with_the_scans_listings_lists_only_dirs_with_deleted_files(
    loop_ext4: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep before each offline cycle reuses the scan's listings: an unchanged partition
    dir without ``*.deleted`` files is not listed again, and one that gains such a file
    (a rename changes the dir's mtime) is."""
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=2)
    past = time.time() - 60  # older than the cache's settle time: cached
    for p in parts.values():
        os.utime(p.path, (past, past))
    cache = ListingCache()
    files = FileExecutor(state, AuditLog(state / "audit.jsonl"), listings=cache)
    listed: list[str] = []
    real_sweep = Sweeper._sweep_partition

    def counting(self: Sweeper, log_dir_real: str, path: str, session: list[Any]) -> None:
        listed.append(os.path.basename(path))
        real_sweep(self, log_dir_real, path, session)

    monkeypatch.setattr(Sweeper, "_sweep_partition", counting)
    files.recover([logs], sweep_deleted=True)
    assert listed == []  # neither dir holds a *.deleted file
    leftover = Path(str(parts[1].segments[0].log_path) + ".deleted")
    os.rename(parts[1].segments[0].log_path, leftover)
    files.recover([logs], sweep_deleted=True)
    assert listed == [parts[1].path.name]
    assert not leftover.exists()


# ----------------------------------------------------------------------------- full disk


def fill_to_the_brim(mount: Path) -> None:
    try:
        with open(mount / "filler", "wb") as fh:
            while True:
                fh.write(b"\xa5" * MiB)
                fh.flush()
                os.fsync(fh.fileno())
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    for i in range(100_000):
        try:
            with open(mount / f"crumb{i}", "wb") as fh:
                fh.write(b"x" * 4096)
                os.fsync(fh.fileno())
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            return


@pytest.mark.parametrize("reserve", [True, False])
def test_a_100_percent_full_disk(loop_ext4: Callable[..., Path], reserve: bool) -> None:
    """State dir on the full filesystem: the audit reserve makes room for the audit line and
    the journal; without it the deletion is refused rather than done unaudited."""
    mnt = loop_ext4(32 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=1)
    d = deletion(logs, mnt, parts[0], parts[0].segments[0])
    state.mkdir()
    audit = AuditLog(state / "audit.jsonl", reserve_bytes=MiB if reserve else 0)
    assert audit.ensure_reserve() is reserve
    fill_to_the_brim(mnt)
    assert df_free(mnt) < 64 * 1024
    before = files_under(logs)
    [result] = FileExecutor(state, audit).execute([d], {str(mnt): 100.0})
    if reserve:
        assert result.ok, result
        assert result.freed_bytes == d.bytes
        phases = [line["phase"] for line in read_audit(state / "audit.jsonl")]
        assert phases == ["intent", "done"]
    else:
        # Whichever of the audit line or the journal entry hit ENOSPC first: not attempted.
        assert result.refused and "not writable" in (result.error or ""), result
        assert files_under(logs) == before


# ----------------------------------------------------------------------------- batches


@pytest.mark.parametrize("fs", ["ext4", "tmpfs"])
def test_one_cycle_is_one_journal_entry_and_a_few_fsyncs_not_six_per_segment(
    loop_ext4: Callable[..., Path],
    tmpfs: Callable[[int], Path],
    monkeypatch: pytest.MonkeyPatch,
    fs: str,
) -> None:
    """Issue 15: six fsyncs per segment capped offline deletion at ~65 segments/s. A batch
    costs one journal fsync, one audit fsync per set of lines (intents, outcomes), one
    journal ``done`` and, after the unlinks, one fsync of the partition dir changed last on
    ext4 (its journal commits in order: that makes every dir's changes durable) or one per
    partition dir elsewhere, whatever its number of segments; the audit log still has one
    intent and one outcome line per segment."""
    mnt = loop_ext4(64 * MiB) if fs == "ext4" else tmpfs(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=3, segments=5)
    chosen = [
        deletion(logs, mnt, parts[p], parts[p].segments[s]) for s in range(4) for p in range(3)
    ]
    ex = executor(state)
    state.mkdir()
    assert ex.audit.ensure_reserve()  # its one-time fsync is not counted
    journal_seen: list[list[dict[str, object]]] = []

    def snapshot_journal(step: str) -> None:
        if step == "journal-done":
            raw = (state / JOURNAL_FILE).read_text().splitlines()
            journal_seen.append([json.loads(line) for line in raw])

    ex._on_step = snapshot_journal
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        os,
        "fsync",
        lambda fd: (fsyncs.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))[1],
    )
    results = ex.execute(chosen, {})
    monkeypatch.undo()
    assert all(r.ok for r in results)
    assert not any(parts[p].segments[s].log_path.exists() for s in range(4) for p in range(3))
    # journal, audit intents, 1 or 3 dirs, audit outcomes, journal done, compaction
    dirs = [os.path.basename(f) for f in fsyncs if os.path.basename(f).startswith("orders-")]
    if fs == "ext4":
        assert dirs == [f"orders-{chosen[-1].partition}"], fsyncs  # the one changed last
    else:
        assert sorted(dirs) == ["orders-0", "orders-1", "orders-2"], fsyncs
    assert len(fsyncs) <= 4 + len(dirs) + 1, len(fsyncs)
    [records] = journal_seen
    intents = [r for r in records if r.get("op") == "intent"]
    assert len(intents) == 1
    names = {
        f"{os.path.basename(sub['partition_dir'])}/{n}"
        for sub in intents[0]["segments"]  # type: ignore[attr-defined]
        for n in sub["names"]
    }
    assert names == set().union(*(segment_names(d) for d in chosen))
    actions = pair_actions(list(read_audit(state / "audit.jsonl")))
    assert len(actions) == len(chosen)
    assert all(a.intent and a.outcome and a.outcome["phase"] == "done" for a in actions)
    assert [(a.first["partition"], a.first["base_offset"]) for a in actions] == [
        (d.partition, d.base_offset) for d in chosen
    ]


def test_recover_a_batch_killed_half_way_finishes_the_started_prefix_cancels_the_rest(
    loop_ext4: Callable[..., Path],
) -> None:
    """Killed while renaming the third segment of a batch of six (its ``.log`` renamed,
    its ``.index`` not): the first three are finished, the last three untouched and
    cancelled (audit ``failed``, planned again); no segment half deleted, no hole."""
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=2, segments=4)
    chosen = [
        deletion(logs, mnt, parts[p], parts[p].segments[s]) for s in range(3) for p in range(2)
    ]
    before = files_under(logs)
    renames: list[str] = []

    def crash(step: str) -> None:
        if step.startswith("rename:"):
            renames.append(step)
            if step.endswith(".index") and sum(s.endswith(".log") for s in renames) == 3:
                raise Crash(step)

    with pytest.raises(Crash):
        executor(state, on_step=crash).execute(chosen, {})
    # Renamed (not unlinked yet): the first two whole-renamed, the third half.
    assert [_segment_state(logs, d) for d in chosen] == ["partial"] * 3 + ["whole"] * 3
    assert executor(state).pending() == 1

    recovered = executor(state).recover([logs])
    assert [r.ok for r in recovered] == [True, True, True, False, False, False]
    assert all("interrupted before" in (r.error or "") for r in recovered[3:])
    assert [_segment_state(logs, d) for d in chosen] == ["gone"] * 3 + ["whole"] * 3
    assert executor(state).pending() == 0
    gone = set().union(*(segment_names(d) for d in chosen[:3]))
    after = files_under(logs)
    assert set(before) - set(after) == gone
    assert {k: v for k, v in before.items() if k not in gone} == after
    actions = pair_actions(list(read_audit(state / "audit.jsonl")))
    assert len(actions) == 6 and all(a.intent and a.outcome for a in actions)
    assert [a.outcome["phase"] for a in actions if a.outcome] == ["done"] * 3 + ["failed"] * 3


def test_an_io_error_in_a_batch_stops_only_that_partition_and_recovery_finishes_it(
    loop_ext4: Callable[..., Path],
) -> None:
    """EIO renaming a segment's ``.index``: that segment fails (journal left open for it),
    the partition's later segments are not touched (never a hole), the other partition's go;
    ``recover`` finishes the started one without reporting the others a second time."""
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=2, segments=4)
    chosen = [
        deletion(logs, mnt, parts[p], parts[p].segments[s]) for s in range(2) for p in range(2)
    ]
    bad_index = parts[0].segments[0].index_path.name
    seen: list[str] = []

    def eio(step: str) -> None:
        seen.append(step)
        if step == f"rename:{bad_index}" and seen.count(step) == 1:  # partition 0's, first
            raise OSError(errno.EIO, "injected I/O error", bad_index)

    results = executor(state, on_step=eio).execute(chosen, {})
    assert [r.ok for r in results] == [False, True, False, True]
    assert "injected" in (results[0].error or "")
    assert "no hole" in (results[2].error or "")
    assert _segment_state(logs, chosen[0]) == "partial"
    assert _segment_state(logs, chosen[2]) == "whole"
    assert executor(state).pending() == 1

    recovered = executor(state).recover([logs])
    assert [(r.deletion.partition, r.deletion.base_offset, r.ok) for r in recovered] == [
        (0, chosen[0].base_offset, True)
    ]
    assert [_segment_state(logs, d) for d in chosen] == ["gone", "gone", "whole", "gone"]
    assert executor(state).pending() == 0


def test_a_plan_longer_than_one_batch_is_split_in_plan_order(
    loop_ext4: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``BATCH_MAX`` bounds a batch (audit reserve, journal record size): a longer plan is
    several batches, each one journal entry, run in plan order; a refusal in the first
    still stops that partition's segments in the later ones (never a hole)."""
    monkeypatch.setattr(fileexecutor, "BATCH_MAX", 2)
    monkeypatch.setattr(fileexecutor, "BATCH_FIRST", 2)
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=2, segments=5)
    chosen = [
        deletion(logs, mnt, parts[p], parts[p].segments[s]) for s in range(3) for p in range(2)
    ]
    # Partition 1's first segment is refused (its .timeindex is a directory).
    ti = parts[1].segments[0].timeindex_path
    os.unlink(ti)
    ti.mkdir()
    intents: list[int] = []

    def count_intents(step: str) -> None:
        if step == "audit":
            raw = (state / JOURNAL_FILE).read_text().splitlines()
            intents.append(sum(json.loads(line)["op"] == "intent" for line in raw))

    results = executor(state, on_step=count_intents).execute(chosen, {})
    assert [r.ok for r in results] == [True, False, True, False, True, False]
    assert all("hole" in (r.error or "") for r in results[3::2])
    assert intents == [1, 2, 3]  # three batches (p0s0 | p0s1 | p0s2): one entry each
    assert [_segment_state(logs, d) for d in chosen] == ["gone", "whole"] * 3
    assert executor(state).pending() == 0


def test_a_batch_abandoned_to_a_broker_keeps_the_outcomes_already_written(
    loop_ext4: Callable[..., Path],
) -> None:
    """Killed between a batch's audit outcomes and its journal ``done``, then a broker takes
    the lock before recovery: the segments with an outcome keep it (one outcome per intent),
    only the others are recorded as abandoned."""
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=1)
    seg0, seg1 = parts[0].segments[0], parts[0].segments[1]
    audit = AuditLog(state / "audit.jsonl")
    state.mkdir()
    audit.append({"action_id": "s1", "phase": "intent", "topic": "orders"})
    audit.append({"action_id": "s2", "phase": "intent", "topic": "orders"})
    audit.append({"action_id": "s1", "phase": "done", "topic": "orders", "freed_bytes": 1})
    _journal(
        state,
        [
            {
                "op": "intent",
                "kind": "batch",
                "action_id": "b1",
                "audit_offset": 0,
                "log_dir_real": str(logs),
                "segments": [
                    {
                        "action_id": f"s{i + 1}",
                        "partition_dir": str(logs / "orders-0"),
                        "names": [seg.log_path.name],
                        "fields": {"topic": "orders", "partition": 0},
                    }
                    for i, seg in enumerate((seg0, seg1))
                ],
            }
        ],
    )
    with hold_lock(logs):
        results = executor(state).recover([logs])
    assert [r.ok for r in results] == [False]
    assert "abandoned" in (results[0].error or "")
    outcomes = [a.outcome for a in pair_actions(list(read_audit(state / "audit.jsonl")))]
    assert [(o or {}).get("phase") for o in outcomes] == ["done", "failed"]
    assert len(list(read_audit(state / "audit.jsonl"))) == 4
    assert executor(state).pending() == 0


def test_batches_start_small_and_double(
    loop_ext4: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch is small (space comes back after a few fsyncs), each next one twice
    the size up to ``BATCH_MAX`` (throughput)."""
    monkeypatch.setattr(fileexecutor, "BATCH_FIRST", 1)
    monkeypatch.setattr(fileexecutor, "BATCH_MAX", 4)
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=1, segments=9)
    chosen = [deletion(logs, mnt, parts[0], parts[0].segments[s]) for s in range(8)]
    sizes: list[int] = []

    def batch_size(step: str) -> None:
        if step == "audit":
            last = json.loads((state / JOURNAL_FILE).read_text().splitlines()[-1])
            sizes.append(len(last["segments"]))

    results = executor(state, on_step=batch_size).execute(chosen, {})
    assert all(r.ok for r in results)
    assert sizes == [1, 2, 4, 1]
    assert [_segment_state(logs, d) for d in chosen] == ["gone"] * 8


def _two_batches(mnt: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, list[Deletion]]:
    """Three deletions over two partitions, run as two batches: [p0s0] and [p1s0, p0s1]."""
    monkeypatch.setattr(fileexecutor, "BATCH_FIRST", 1)
    monkeypatch.setattr(fileexecutor, "BATCH_MAX", 2)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=2, segments=4)
    plan = ((0, 0), (1, 0), (0, 1))  # (partition, segment)
    return logs, state, [deletion(logs, mnt, parts[p], parts[p].segments[i]) for p, i in plan]


@pytest.mark.parametrize("fs", ["ext4", "tmpfs"])
def test_a_batch_is_made_durable_after_the_next_ones_unlinks_where_the_journal_keeps_order(
    fs: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: a batch's dir fsync waits for a journal commit behind any writer on the log
    disk, so on ext4 (its journal commits in order) it runs after the next batch's unlinks,
    whose space no longer waits for it. Where operations may reach the disk out of order
    (tmpfs stands for those here) each batch is durable before the next starts: otherwise a
    power loss could keep batch 2's unlinks and lose batch 1's, a hole. Write-ahead holds in
    both: each batch's journal intent before its first rename, its outcomes and ``done``
    only after the fsync that covers it."""
    mnt = request.getfixturevalue("loop_ext4" if fs == "ext4" else "tmpfs")(64 * MiB)
    logs, state, chosen = _two_batches(mnt, monkeypatch)
    steps: list[str] = []
    journal_at_rename: list[tuple[int, int]] = []

    def record(step: str) -> None:
        kind = step.split(":")[0]
        if not steps or steps[-1] != kind:
            steps.append(kind)
        if kind == "rename":
            ops = [json.loads(x)["op"] for x in (state / JOURNAL_FILE).read_text().splitlines()]
            journal_at_rename.append((ops.count("intent"), ops.count("done")))

    results = executor(state, on_step=record).execute(chosen, {})
    assert all(r.ok for r in results)
    start, finish = (
        ["journal", "audit", "rename", "unlink"],
        ["fsync-unlinked", "audit-done", "journal-done"],
    )
    if fs == "ext4":
        assert steps == [*start, *start, *finish, *finish]
        # Batch 1's renames under its own intent; batch 2's under both, batch 1 not done yet.
        batch2 = {(2, 0)}
    else:
        assert steps == [*start, *finish, *start, *finish]
        batch2 = {(2, 1)}
    assert set(journal_at_rename[:3]) == {(1, 0)} and set(journal_at_rename[3:]) == batch2
    assert [_segment_state(logs, d) for d in chosen] == ["gone"] * 3
    actions = pair_actions(list(read_audit(state / "audit.jsonl")))
    assert [(a.outcome or {}).get("phase") for a in actions] == ["done"] * 3
    assert executor(state).pending() == 0


@pytest.mark.parametrize("crash_at", ["rename:5", "fsync-unlinked:1", "journal-done:1"])
def test_a_crash_while_two_batches_are_open_recovers_a_prefix_of_the_plan(
    loop_ext4: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, crash_at: str
) -> None:
    """Killed in batch 2's renames, at batch 1's fsync, or between batch 1's outcomes and
    its ``done`` (after batch 2's unlinks): both journal entries are open; recovery finishes
    every started segment (all of batch 1, batch 2's prefix), cancels the untouched, and
    every intent gets exactly one outcome."""
    logs, state, chosen = _two_batches(loop_ext4(64 * MiB), monkeypatch)
    kind, nth = crash_at.split(":")
    seen: list[str] = []

    def crash(step: str) -> None:
        if step.split(":")[0] == kind:
            seen.append(step)
            if len(seen) == int(nth):
                raise Crash(step)

    with pytest.raises(Crash):
        executor(state, on_step=crash).execute(chosen, {})
    assert executor(state).pending() == 2
    recovered = executor(state).recover([logs])
    states = [_segment_state(logs, d) for d in chosen]
    assert "partial" not in states
    assert states == sorted(states, key=lambda s: s != "gone")
    assert states[0] == "gone"  # batch 1 was whole-started before batch 2 began
    assert all(r.ok or "interrupted before" in (r.error or "") for r in recovered)
    actions = pair_actions(list(read_audit(state / "audit.jsonl")))
    assert len(actions) == 3 and all(a.intent and a.outcome for a in actions)
    assert executor(state).pending() == 0


def test_a_failed_dir_fsync_learnt_after_the_next_batch_leaves_its_entry_to_recovery(
    loop_ext4: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO from batch 1's dir fsync comes after batch 2's unlinks: batch 1's segment fails
    and its entry stays open, batch 2 is done; ``recover`` finishes batch 1's segment."""
    logs, state, chosen = _two_batches(loop_ext4(64 * MiB), monkeypatch)
    real_fsync = os.fsync
    failed: list[str] = []

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not failed and os.path.basename(path).startswith("orders-"):
            failed.append(path)
            raise OSError(errno.EIO, "injected I/O error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    results = executor(state).execute(chosen, {})
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert [r.ok for r in results] == [False, True, True]
    assert "injected" in (results[0].error or "")
    assert executor(state).pending() == 1
    recovered = executor(state).recover([logs])
    assert [(r.deletion.base_offset, r.ok) for r in recovered] == [(chosen[0].base_offset, True)]
    assert [_segment_state(logs, d) for d in chosen] == ["gone"] * 3
    assert executor(state).pending() == 0


# ------------------------------------------------------------------- power loss out of order


class _PowerLoss(BaseException):
    """Stands for the machine dying at a step: nothing after it happens."""


def _intended_batch(
    logs: Path, state: Path, chosen: list[Deletion], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch exactly as ``execute`` records it, durably intended (journal entry and audit
    intents written) and nothing renamed yet; the owner dropped, as after a reboot."""

    def die_at_first_rename(step: str) -> None:
        if step.startswith("rename:"):
            raise _PowerLoss

    with pytest.raises(_PowerLoss):
        executor(state, on_step=die_at_first_rename).execute(chosen, {})
    entries = [json.loads(line) for line in (state / JOURNAL_FILE).read_text().splitlines()]
    [entry] = [e for e in entries if e.get("op") == "intent"]
    entry.pop("owner", None)
    _journal(state, [entry])


def test_a_power_loss_that_kept_a_later_unlink_but_not_an_earlier_rename_leaves_no_hole(
    loop_ext4: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch fsyncs its partition dirs once, after the unlinks (issue 15: that fsync before
    the unlinks was what a crossing waited on). A filesystem that does not keep directory
    operations in order could then lose segment 0's renames but keep segment 1's unlinks.
    Recovery finishes segment 0 too (its intent was durable): the partition is a prefix, not
    0 | hole | 2. Another partition's untouched segment is cancelled as before."""
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=2, segments=4)
    chosen = [
        deletion(logs, mnt, parts[0], parts[0].segments[0]),
        deletion(logs, mnt, parts[0], parts[0].segments[1]),
        deletion(logs, mnt, parts[1], parts[1].segments[0]),
    ]
    _intended_batch(logs, state, chosen, monkeypatch)
    for f in chosen[1].files:  # the later segment's unlinks survived; nothing else did
        os.unlink(f)
    assert [_segment_state(logs, d) for d in chosen] == ["whole", "gone", "whole"]
    results = executor(state).recover([logs])
    assert [_segment_state(logs, d) for d in chosen] == ["gone", "gone", "whole"]
    assert sorted((r.deletion.partition, r.deletion.base_offset, r.ok) for r in results) == [
        (0, chosen[0].base_offset, True),
        (0, chosen[1].base_offset, True),
        (1, chosen[2].base_offset, False),
    ]
    assert parts[0].segments[2].log_path.exists() and parts[0].segments[3].log_path.exists()
    actions = pair_actions(list(read_audit(state / "audit.jsonl")))
    assert [(a.outcome or {}).get("phase") for a in actions] == ["done", "done", "failed"]
    assert executor(state).pending() == 0


def test_closing_a_hole_still_needs_a_newer_segment(
    loop_ext4: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segment after the hole is gone, so the proof that the untouched one is closed is
    any newer ``.log``; with none left (everything after it vanished), it is kept."""
    mnt = loop_ext4(64 * MiB)
    logs, state = mnt / "logs", mnt / "state"
    parts = make_log_dir(logs, partitions=1, segments=3)
    chosen = [deletion(logs, mnt, parts[0], s) for s in parts[0].segments[:2]]
    _intended_batch(logs, state, chosen, monkeypatch)
    for seg in parts[0].segments[1:]:
        for f in seg.files:
            if f.exists():
                os.unlink(f)
    results = executor(state).recover([logs])
    assert _segment_state(logs, chosen[0]) == "whole"
    [kept] = [r for r in results if r.deletion.base_offset == chosen[0].base_offset]
    assert not kept.ok and "no segment at or after next offset" in (kept.error or "")


def test_a_partition_dir_that_cannot_be_opened_fails_its_segments_only(tmp_path: Path) -> None:
    """A batch whose partition dir vanished after the guard rails: its segment fails with the
    reason, the other partition's segment goes, and nothing raises (the dirs' fsync loop
    must not reach for a dir it never opened)."""
    parts = make_log_dir(tmp_path / "logs", partitions=2, segments=3)
    gone = tmp_path / "logs" / "orders-9"
    subs = [
        {"partition_dir": str(gone), "names": ["00000000000000000000.log"]},
        {
            "partition_dir": str(parts[1].path),
            "names": sorted(os.path.basename(f) for f in parts[1].segments[0].files),
        },
    ]
    remover = SegmentRemover()
    [(_, missing, missing_untouched), (freed, err, _)] = remover.finish_batch(
        remover.start_batch(subs)
    )
    assert missing is not None and "No such file" in missing and not missing_untouched
    assert err is None and freed > 0
    assert not parts[1].segments[0].log_path.exists()
