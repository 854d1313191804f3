"""Offline mode: what Kafka removes at start-up goes first (``-delete`` dirs, ``*.deleted``
files), audited; and two diskguard processes sharing one state dir never step on each other's
journal entries (issue 11, items 4 and 9). Real loop ext4, real subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from diskguard.retention.audit import AuditLog, pair_actions, read_audit
from diskguard.retention.offline.fileexecutor import FileExecutor
from diskguard.retention.offline.journal import JOURNAL_FILE, JOURNAL_LOCK_FILE
from diskguard.retention.offline.sweeptargets import sweepable_bytes
from support.cli import json_events, run_cli
from support.configs import write_config
from support.disks import df_percent, disk_capacity, files_under
from support.fsfixtures import fill
from support.kafkagen import SegmentSpec, write_log_dir

MiB = 1024 * 1024
BASE_TS = 1_700_000_000_000


def seg_at(minute: int) -> SegmentSpec:
    return SegmentSpec(
        records=30,
        payload_size=4000,
        records_per_batch=3,
        timestamp_step_ms=10,
        first_timestamp_ms=BASE_TS + minute * 60_000,
    )


def executor(state: Path) -> FileExecutor:
    return FileExecutor(state, AuditLog(state / "audit.jsonl"))


# ------------------------------------------------------------------- item 4: -delete dirs


def test_offline_sweeps_delete_dirs_first_and_keeps_live_segments_when_that_suffices(
    loop_ext4: Callable[..., Path], tmp_path: Path
) -> None:
    mnt = loop_ext4(128 * MiB)
    log_dir = mnt / "kafka-logs"
    write_log_dir(
        log_dir, {("orders", p): [seg_at(p * 10 + i) for i in range(8)] for p in range(3)}
    )
    # A topic the operator deleted (Kafka removes it after start-up), new and legacy names.
    doomed = log_dir / "gone-0.3f2a9c5b7e8d4f10a1b2c3d4e5f60718-delete"
    doomed.mkdir()
    fill(doomed / "00000000000000000000.log", 32 * MiB)
    fill(doomed / "00000000000000000000.index", 64 * 1024)
    (doomed / "partition.metadata").write_text("version: 0\n")
    legacy = log_dir / "gone-1-delete"
    legacy.mkdir()
    fill(legacy / "00000000000000000000.log", MiB)
    # A leftover of an earlier deletion, and what must never be touched.
    orders0 = log_dir / "orders-0"
    leftover = orders0 / "00000000000000999999.log.deleted"
    fill(leftover, 512 * 1024)
    keep = {
        "future": log_dir / "orders-1.9a8b7c6d5e4f30211203a4b5c6d7e8f9-future",
        "stray": log_dir / "orders-2.0123456789abcdef0123456789abcdef-stray",
    }
    for d in keep.values():
        d.mkdir()
        fill(d / "00000000000000000000.log", 2 * MiB)
    outside = mnt / "outside"
    outside.mkdir()
    fill(outside / "precious.log", MiB)
    os.symlink(outside, doomed / "link-out")  # never followed while sweeping
    os.sync()
    # The ceiling: 3 points under usage, far less than the 33 MiB the sweep frees.
    limit = round(df_percent(mnt) - 3, 2)
    live_before = {
        k: v
        for k, v in files_under(log_dir).items()
        if k.startswith("orders-")
        and k.split("/")[0] in {"orders-0", "orders-1", "orders-2"}
        and not k.endswith(".deleted")
    }
    keep_before = {name: files_under(d) for name, d in keep.items()}
    cfg = write_config(
        tmp_path, [log_dir], disk_usage_percent=limit, mode="offline", offline_headroom=0
    )

    # `plan` previews the sweep: what it frees is pending reclaim, so no live segment.
    plan_before = json.loads(run_cli("plan", "--json", "-c", str(cfg)).stdout)
    assert plan_before["mode"] == "offline" and plan_before["deletions"] == []
    (fs_before,) = plan_before["filesystems"]
    assert fs_before["pending_reclaim_bytes"] >= 33 * MiB and fs_before["excess_bytes"] == 0
    human = run_cli("plan", "-c", str(cfg)).stdout
    assert "the offline sweep removes first" in " ".join(human.split()), human

    proc = run_cli("enforce", "--once", "-c", str(cfg))

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not doomed.exists() and not legacy.exists() and not leftover.exists()
    after = files_under(log_dir)
    assert {k: after.get(k) for k in live_before} == live_before, "a live segment went"
    assert {name: files_under(d) for name, d in keep.items()} == keep_before
    assert (outside / "precious.log").stat().st_size == MiB
    os.sync()
    assert df_percent(mnt) <= limit
    events = json_events(proc.stdout)
    assert not [e for e in events if e.get("event") == "segment_deleted"]

    lines = list(read_audit(tmp_path / "state" / "audit.jsonl"))
    actions = pair_actions(lines)
    assert actions and all(a.intent is not None and a.outcome is not None for a in actions)
    assert all(a.intent and a.intent.get("kind") == "swept" for a in actions)
    by_path = {a.intent["path"]: a for a in actions if a.intent}
    assert set(by_path) == {str(doomed), str(legacy), str(orders0)}
    big = by_path[str(doomed)]
    assert big.outcome is not None and big.outcome["phase"] == "done"
    assert big.intent is not None and big.intent["bytes"] >= 32 * MiB
    assert big.outcome["freed_bytes"] >= 32 * MiB
    assert by_path[str(orders0)].intent["names"] == [leftover.name]  # type: ignore[index]
    # `diskguard audit` shows them.
    shown = run_cli("audit", "-c", str(cfg))
    assert shown.returncode == 0 and "swept" in shown.stdout, shown.stdout + shown.stderr
    as_json = run_cli("audit", "--json", "-c", str(cfg))
    kinds = {json.loads(line).get("kind") for line in as_json.stdout.splitlines()}
    assert kinds == {"swept"}


def test_offline_sweep_then_live_segments_for_what_remains(
    loop_ext4: Callable[..., Path], tmp_path: Path
) -> None:
    """The sweep frees less than the excess: the rest comes from the oldest live segments,
    planned after the sweep (so exactly what remains, not the whole excess again)."""
    mnt = loop_ext4(64 * MiB)
    log_dir = mnt / "kafka-logs"
    write_log_dir(
        log_dir, {("orders", p): [seg_at(p * 10 + i) for i in range(8)] for p in range(3)}
    )
    doomed = log_dir / "gone-0.aa-delete"
    doomed.mkdir()
    fill(doomed / "00000000000000000000.log", 2 * MiB)
    fill(mnt / "filler", 20 * MiB)
    os.sync()
    capacity = disk_capacity(mnt)
    # 3 MiB over: the 2 MiB dir and about 1 MiB of the ~2.6 MiB of closed live segments.
    limit = round(df_percent(mnt) - 100 * 3 * MiB / capacity, 3)
    cfg = write_config(
        tmp_path, [log_dir], disk_usage_percent=limit, mode="offline", offline_headroom=0
    )
    plan_before = json.loads(run_cli("plan", "--json", "-c", str(cfg)).stdout)
    human_before = run_cli("plan", "-c", str(cfg)).stdout
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not doomed.exists()
    os.sync()
    assert df_percent(mnt) <= limit
    deleted = [e for e in json_events(proc.stdout) if e.get("event") == "segment_deleted"]
    # The plan counted what the sweep frees as pending reclaim: it chose exactly the live
    # segments that went after the sweep.
    (fs_before,) = plan_before["filesystems"]
    assert fs_before["pending_reclaim_bytes"] >= 2 * MiB
    planned = [(d["topic"], d["partition"], d["base_offset"]) for d in plan_before["deletions"]]
    assert "the offline sweep removes first" in " ".join(human_before.split()), human_before
    assert planned == [(e["topic"], e["partition"], e["base_offset"]) for e in deleted]
    assert planned, plan_before
    actions = pair_actions(list(read_audit(tmp_path / "state" / "audit.jsonl")))
    kinds = [a.first.get("kind", "segment") for a in actions]
    assert kinds[0] == "swept" and set(kinds[1:]) == {"segment"}, kinds


# ------------------------------------------------------------ item 9: concurrent processes

_OWNER = r"""
import json, os, sys
from pathlib import Path
from diskguard.retention.audit import AuditLog
from diskguard.retention.offline.fileexecutor import FileExecutor
from diskguard.retention.planner import Deletion

state, pause_at, spec = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
deletions = [Deletion(**{**d, "files": tuple(d["files"])}) for d in json.loads(spec.read_text())]

def on_step(name):
    if name == pause_at:
        sys.stdout.write("paused\n")
        sys.stdout.flush()
        sys.stdin.readline()  # the test says when to go on (or kills us)

results = FileExecutor(state, AuditLog(state / "audit.jsonl"), on_step=on_step).execute(
    deletions, {}
)
sys.stdout.write(json.dumps([r.ok for r in results]) + "\n")
"""


@contextlib.contextmanager
def owner_paused(state: Path, pause_at: str, spec: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(state), pause_at, str(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "paused\n", (line, proc.stderr.read() if proc.stderr else "")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _spec(tmp_path: Path, log_dir: Path, mnt: Path) -> tuple[Path, list[Path]]:
    layout = write_log_dir(log_dir, {("orders", 0): [seg_at(s) for s in range(3)]})
    part = layout.partitions[("orders", 0)]
    seg = part.segments[0]
    files = [p for p in seg.files if p.exists()]
    d = {
        "log_dir": str(log_dir),
        "topic": "orders",
        "partition": 0,
        "base_offset": seg.base_offset,
        "next_offset": seg.next_offset,
        "max_timestamp_ms": seg.max_timestamp_ms,
        "bytes": sum(os.lstat(p).st_blocks * 512 for p in files),
        "files": [str(p) for p in files],
        "mount": str(mnt),
    }
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([d]))
    return spec, files


def test_recover_from_another_process_leaves_a_live_owners_entry_alone(
    loop_ext4: Callable[..., Path], tmp_path: Path
) -> None:
    """The issue's case: a daemon starts while ``enforce --once`` is mid-deletion."""
    mnt = loop_ext4(64 * MiB)
    log_dir, state = mnt / "logs", mnt / "state"
    spec, files = _spec(tmp_path, log_dir, mnt)
    # Paused after the .log was renamed, still holding the .lock: a deletion in flight.
    with owner_paused(state, f"rename:{files[1].name}", spec) as owner:
        before = files_under(log_dir)
        results = executor(state).recover([log_dir], sweep_deleted=True)
        assert results == []
        assert files_under(log_dir) == before
        assert executor(state).pending() == 1
        assert [a.outcome for a in pair_actions(list(read_audit(state / "audit.jsonl")))] == [None]
        assert owner.stdin is not None and owner.stdout is not None
        owner.stdin.write("go\n")
        owner.stdin.flush()
        assert json.loads(owner.stdout.readline()) == [True]
    assert not any(p.exists() for p in files)
    lines = list(read_audit(state / "audit.jsonl"))
    assert [line["phase"] for line in lines] == ["intent", "done"], lines
    assert executor(state).pending() == 0


def test_recover_finishes_the_entry_once_its_owner_is_gone(
    loop_ext4: Callable[..., Path], tmp_path: Path
) -> None:
    mnt = loop_ext4(64 * MiB)
    log_dir, state = mnt / "logs", mnt / "state"
    spec, files = _spec(tmp_path, log_dir, mnt)
    with owner_paused(state, f"rename:{files[1].name}", spec) as owner:
        assert executor(state).recover([log_dir]) == []
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    [result] = executor(state).recover([log_dir])
    assert result.ok, result
    assert not any(p.exists() for p in files)
    assert not any(Path(str(p) + ".deleted").exists() for p in files)
    [action] = pair_actions(list(read_audit(state / "audit.jsonl")))
    assert action.outcome is not None and action.outcome["phase"] == "done"
    assert action.outcome.get("recovered") is True
    assert executor(state).pending() == 0


def test_a_reused_pid_is_not_taken_for_the_owner(
    loop_ext4: Callable[..., Path], tmp_path: Path
) -> None:
    """An entry whose pid now belongs to another process (same pid, other start time) is a
    crashed owner's: recovered, not left alone forever."""
    mnt = loop_ext4(64 * MiB)
    log_dir, state = mnt / "logs", mnt / "state"
    spec, files = _spec(tmp_path, log_dir, mnt)
    with owner_paused(state, f"rename:{files[1].name}", spec) as owner:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    journal = state / JOURNAL_FILE
    [entry] = [json.loads(line) for line in journal.read_text().splitlines()]
    # Pretend a live process (this one) got the dead owner's pid: start time differs.
    entry["owner"]["pid"] = os.getppid()
    journal.write_text(json.dumps(entry) + "\n")
    [result] = executor(state).recover([log_dir])
    assert result.ok, result
    assert not any(p.exists() for p in files)


def test_journal_compaction_waits_for_another_process_appending(tmp_path: Path) -> None:
    """Compaction (read: nothing open -> truncate) and another process's append are
    serialized by an flock on ``<state_dir>/offline-journal.lock``: the appended intent is
    never truncated away."""
    state = tmp_path / "state"
    state.mkdir()
    journal = state / JOURNAL_FILE
    journal.write_text('{"op": "intent", "action_id": "a"}\n{"op": "done", "action_id": "a"}\n')
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "sys.stdin.readline()\n"
            "with open(sys.argv[2], 'a') as fh:\n"
            '    fh.write(\'{"op": "intent", "action_id": "b"}\\n\')\n',
            str(state / JOURNAL_LOCK_FILE),
            str(journal),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        compactor = threading.Thread(target=executor(state).journal.compact)
        compactor.start()
        compactor.join(timeout=0.5)
        assert compactor.is_alive(), "compaction did not wait for the journal lock"
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
        compactor.join(timeout=30)
        assert not compactor.is_alive()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert '"b"' in journal.read_text()
    assert executor(state).pending() == 1


def test_a_mount_inside_a_delete_dir_is_never_emptied(
    loop_ext4: Callable[..., Path], tmp_path: Path
) -> None:
    """rm -rf semantics would empty a filesystem mounted below a ``-delete`` dir; the sweep
    refuses the whole dir instead (and removes other -delete dirs as usual)."""
    mnt = loop_ext4(64 * MiB)
    log_dir, state = mnt / "logs", tmp_path / "state"
    write_log_dir(log_dir, {("orders", 0): [seg_at(0), seg_at(1)]})
    doomed = log_dir / "gone-0.bb-delete"
    (doomed / "sub").mkdir(parents=True)
    fill(doomed / "00000000000000000000.log", MiB)
    other = log_dir / "gone-1.cc-delete"
    other.mkdir()
    fill(other / "00000000000000000000.log", MiB)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(doomed / "sub")], check=True
    )
    try:
        (doomed / "sub" / "precious").write_text("on another filesystem")
        # The preview counts what the sweep will free, names what it will refuse.
        freed, problems = sweepable_bytes(str(log_dir))
        assert MiB <= freed < 2 * MiB
        assert len(problems) == 1 and str(doomed) in problems[0], problems
        assert "another filesystem" in problems[0]
        executor(state).recover([log_dir], sweep_deleted=True)
        assert (doomed / "sub" / "precious").read_text() == "on another filesystem"
        assert (doomed / "00000000000000000000.log").exists()
        assert not other.exists()
    finally:
        subprocess.run(["umount", str(doomed / "sub")], check=False)
    swept = {a.first["path"] for a in pair_actions(list(read_audit(state / "audit.jsonl")))}
    assert swept == {str(other)}
