"""Crash points, exhaustively: kill ``diskguard enforce --once`` (offline) at each of its
file-system operations in turn, then check that one clean re-run converges.

One module of ~700 lines on purpose: the driver, the strace runs, the reference run and the
convergence checks are one procedure, shared by the test and ``bench/crashpoints.py``.

How (fast enough for the test suite): one driver process imports diskguard once. For a crash
point it forks a child that stops itself (``SIGSTOP``) before running the real CLI entry
point (``enforce --once``); ``strace -p CHILD -f -e inject=SYSCALL:signal=SIGKILL:when=N``
attaches, the child is continued and dies *on entry* of its N-th call of that syscall (the
call itself does not happen), exactly as a ``kill -9`` between two operations would leave it.
strace counts injections per syscall and per process, so each crash point is one
``(syscall, N)``; a counting pass (``-e trace=...``, same attach) first lists every call of
every injected syscall, and N then runs over all of them: every state-changing operation of
the executor is one crash point ("the moment before it"), plus the uninterrupted run.

Each crash point starts from a fresh copy of the scenario's tree on a per-worker tmpfs (log
dirs) and an empty state dir on another tmpfs (so audit and journal writes never change the
log filesystem's usage, and every run makes the same calls). After the kill, the CLI runs
again without injection, and the result is compared with the uninterrupted run's:

- exactly the same files are left (so exactly the planned segments, ``-delete`` dirs and
  ``*.deleted`` files are gone), each untouched (same inode, size and mtime as in the copy);
  no segment half-deleted, no ``*.deleted`` left;
- the audit log: every intent has exactly one outcome, at most one intent and one outcome
  per action; every gone segment has exactly one ``done``, no ``done`` for a segment still
  there; a ``failed`` outcome only for a deletion cancelled before it touched anything; every
  swept ``-delete`` dir and ``*.deleted`` file is covered by a ``done`` swept action; no
  journal entry left open.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diskguard.cli import cli  # imported once here: every forked child starts warm
from diskguard.retention.audit import AuditLog, read_audit
from diskguard.retention.offline.fileexecutor import FileExecutor
from support import configs, fsfixtures
from support.disks import ceiling_under
from support.kafkagen import SegmentSpec, write_log_dir

MiB = 1024 * 1024
BASE_TS = 1_700_000_000_000

#: Every syscall through which the executor (or anything it calls) changes the disk: renames
#: (Python's ``os.rename(dir_fd=...)`` is ``renameat``; ``rename``/``renameat2`` for other
#: libcs and architectures), unlinks and rmdirs (``unlinkat`` with and without
#: ``AT_REMOVEDIR``), durability points, appends to the audit log and journal (and stdout's
#: log lines), truncation (journal compaction, an audit line rolled back) and ``fallocate``
#: (the audit reserve). ``flock``/``open`` change nothing a restart reads.
_INJECTED = (
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "rmdir",
    "fsync",
    "fdatasync",
    "write",
    "pwrite64",
    "writev",
    "truncate",
    "ftruncate",
    "fallocate",
)

#: A *.deleted file or segment file name: (20 digits).suffix[.deleted]
_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex|snapshot)(\.deleted)?$")


# --------------------------------------------------------------------------- scenarios


def _seg(minute: int, payload: int = 1500) -> SegmentSpec:
    return SegmentSpec(
        records=6,
        payload_size=payload,
        records_per_batch=2,
        timestamp_step_ms=10,
        first_timestamp_ms=BASE_TS + minute * 60_000,
    )


def _write_garbage(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x5a" * size)


def _kafka_leftovers(log_dir: Path, tag: str, delete_bytes: int) -> None:
    """What the sweep removes (a -delete dir, new and legacy names; *.deleted files) and what
    it must not (a -future and a -stray dir, look-alike names)."""
    doomed = log_dir / f"gone{tag}-0.5a1b2c3d4e5f60718293a4b5c6d7e8f9-delete"
    _write_garbage(doomed / "00000000000000000000.log", delete_bytes)
    _write_garbage(doomed / "00000000000000000000.index", 8192)
    _write_garbage(doomed / "00000000000000000000.timeindex", 8192)
    (doomed / "partition.metadata").write_text("version: 0\ntopic_id: x\n")
    legacy = log_dir / f"gone{tag}-1-delete"
    _write_garbage(legacy / "00000000000000000000.log", 64 * 1024)
    for name in ("t0-0", "t1-0"):
        part = log_dir / name
        if part.is_dir():
            _write_garbage(part / "00000000000000900000.log.deleted", 48 * 1024)
            _write_garbage(part / "00000000000000900000.index.deleted", 4096)
            _write_garbage(part / "00000000000000900000.snapshot.deleted", 4096)
            (part / "notes.deleted").write_text("not a segment file: never swept\n")
    _write_garbage(
        log_dir / "t0-1.0123456789abcdef0123456789abcdef-future" / ("0" * 20 + ".log"), 32768
    )
    _write_garbage(
        log_dir / "t0-2.fedcba9876543210fedcba9876543210-stray" / ("0" * 20 + ".log"), 32768
    )


def _build_mixed(root: Path, dirs: int, partitions: int, segments: int, delete_bytes: int) -> None:
    for d in range(dirs):
        log_dir = root / f"logs{d}"
        specs = {}
        for t in range(2):
            for p in range(partitions):
                # Interleaved ages: one cycle's deletions hop between partitions and dirs.
                specs[(f"t{t}", p)] = [
                    _seg(s * 100 + (t * partitions + p) * dirs + d) for s in range(segments)
                ]
        write_log_dir(log_dir, specs, segment_index_bytes=64 * 1024)
        _kafka_leftovers(log_dir, str(d), delete_bytes)


@dataclass(frozen=True)
class Scenario:
    """A tree and a ceiling. ``over`` is how far above the ceiling the tree puts the disk, as
    a fraction of (what the sweep frees + the closed live segments' bytes): below the
    sweep's share, the sweep alone must bring it under."""

    name: str
    build: Callable[[Path], None]
    log_dirs: tuple[str, ...]
    over: float
    description: str


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "sweep+segments",
            lambda root: _build_mixed(root, 1, 3, 9, 96 * 1024),
            ("logs0",),
            0.75,
            "1 log dir, 6 partitions x 9 segments, a -delete dir (new and legacy name), "
            "*.deleted files in 2 partitions; the sweep frees too little, live segments follow",
        ),
        Scenario(
            "two-log-dirs",
            lambda root: _build_mixed(root, 2, 2, 6, 64 * 1024),
            ("logs0", "logs1"),
            0.6,
            "2 log dirs on one filesystem, 4 partitions x 6 segments each, leftovers in both; "
            "deletions alternate between the dirs",
        ),
        Scenario(
            "many-segments",
            lambda root: _build_mixed(root, 1, 5, 9, 64 * 1024),
            ("logs0",),
            0.8,
            "1 log dir, 10 partitions x 9 segments, leftovers; ~60 live segments in one batch "
            "(renames and unlinks are most of a batched deletion's calls)",
        ),
        Scenario(
            "sweep-only",
            lambda root: _build_mixed(root, 1, 2, 4, MiB),
            ("logs0",),
            0.3,
            "the -delete dir alone covers the excess: no live segment may go",
        ),
    )
}


# --------------------------------------------------------------------------- tree state


@dataclass(frozen=True)
class FileState:
    ino: int
    size: int
    mtime_ns: int
    mode: int


def _tree_state(root: Path) -> dict[str, FileState]:
    out: dict[str, FileState] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, root)] = FileState(
                st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode
            )
    return out


def _segment_groups(paths: Sequence[str]) -> dict[tuple[str, int], set[str]]:
    """(partition dir relpath, base offset) -> the segment's own files present (no .snapshot,
    ``.deleted`` kept as such)."""
    out: dict[tuple[str, int], set[str]] = {}
    for rel in paths:
        head, name = os.path.split(rel)
        m = _SEGMENT_FILE.match(name)
        if not m or m.group(2) == "snapshot" or m.group(3) or "-delete" in head:
            continue
        out.setdefault((head, int(m.group(1))), set()).add(name)
    return out


# --------------------------------------------------------------------------- running the CLI


def _child_main(argv: list[str], out_path: Path, stop: bool) -> None:
    """In the forked child: the real CLI, its stdout/stderr in ``out_path``; never returns."""
    code = 1
    try:
        fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = sys.stdout
        if stop:
            os.kill(os.getpid(), signal.SIGSTOP)
        try:
            cli.main(args=argv, prog_name="diskguard")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        code = 99
    finally:
        os._exit(code)


def _fork(argv: list[str], out_path: Path, stop: bool) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child_main(argv, out_path, stop)
    return pid


def _wait(pid: int) -> tuple[str, int]:
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "signal", os.WTERMSIG(status)
    return "exit", os.WEXITSTATUS(status)


def _run_plain(argv: list[str], out_path: Path) -> tuple[str, int]:
    return _wait(_fork(argv, out_path, stop=False))


def _run_traced(argv: list[str], out_path: Path, strace_args: list[str]) -> tuple[str, int]:
    """Fork the CLI stopped, attach strace with ``strace_args``, let it run; its end."""
    pid = _fork(argv, out_path, stop=True)
    try:
        _, status = os.waitpid(pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            raise RuntimeError(f"child {pid} did not stop: status {status}")
        tracer = subprocess.Popen(
            ["strace", "-f", *strace_args, "-p", str(pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    try:
        # "Process N attached" is printed once strace has seized *and interrupted* the
        # child: from then on it runs only under strace's control, so no call is missed.
        _await_attached(tracer, pid)
        os.kill(pid, signal.SIGCONT)
        result = _wait(pid)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        raise
    finally:
        try:
            tracer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            tracer.kill()
            tracer.wait()
        if tracer.stderr is not None:
            tracer.stderr.close()
    return result


def _await_attached(tracer: subprocess.Popen[bytes], pid: int, timeout_s: float = 30) -> None:
    assert tracer.stderr is not None
    buf = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(tracer.stderr, selectors.EVENT_READ)
        while b"attached" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise RuntimeError(f"strace did not attach to {pid}: {buf.decode()[-500:]}")
            chunk = os.read(tracer.stderr.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"strace exited before attaching: {buf.decode()[-500:]}")
            buf += chunk


# --------------------------------------------------------------------------- one worker


@dataclass
class _Workspace:
    """A worker's two mounts (the state dir's a tmpfs, the log dirs' ``logs_fs``), fixed
    paths (so every run makes the same calls)."""

    scenario: Scenario
    template: Path
    logs_mnt: Path
    state_mnt: Path
    logs_fs: str = "tmpfs"
    config: Path = field(init=False)

    def __post_init__(self) -> None:
        self.config = self.state_mnt / "diskguard.toml"

    @property
    def root(self) -> Path:
        return self.logs_mnt / "tree"

    @property
    def state(self) -> Path:
        return self.state_mnt / "state"

    def argv(self) -> list[str]:
        return ["enforce", "--once", "-c", str(self.config)]

    def reset(self) -> dict[str, FileState]:
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.state, ignore_errors=True)
        shutil.copytree(self.template, self.root, symlinks=True)
        self.state.mkdir()
        return _tree_state(self.root)


def _prepare_template(scenario: Scenario, template: Path) -> None:
    scenario.build(template)


def _write_config(ws: _Workspace) -> None:
    """The ceiling ``over`` x (sweepable + closed live bytes) below the tree's usage."""
    ws.reset()
    swept = 0
    live = 0
    state = _tree_state(ws.root)
    groups = _segment_groups(list(state))
    active = {head: max(b for h, b in groups if h == head) for head, _ in groups}
    for rel, fs in state.items():
        if fs.mode & 0o170000 != 0o100000:
            continue
        blocks = os.lstat(ws.root / rel).st_blocks * 512
        head, name = os.path.split(rel)
        m = _SEGMENT_FILE.match(name)
        if "-delete" in rel or (name.endswith(".deleted") and m):
            swept += blocks
        elif (
            m
            and not m.group(3)
            and m.group(2) != "snapshot"
            and "-future" not in head
            and "-stray" not in head
            and int(m.group(1)) != active.get(head)
        ):
            live += blocks
    excess = int((swept + live) * ws.scenario.over)
    if ws.logs_fs == "ext4":
        # An ext4 directory never shrinks, and renaming a batch's files to the longer
        # ``*.deleted`` names can grow each partition dir by a block: that much of what the
        # files free is not freed. Ask for that much less (tmpfs dirs take no blocks).
        excess -= os.statvfs(ws.logs_mnt).f_frsize * len({head for head, _ in groups})
    configs.write_config(
        ws.config.parent,
        [ws.root / d for d in ws.scenario.log_dirs],
        logging={"level": "info"},
        state_dir=ws.state,
        name=ws.config.name,
        disk_usage_percent=round(ceiling_under(ws.logs_mnt, excess), 4),
        mode="offline",
        offline_headroom=0,
    )


@dataclass(frozen=True)
class Reference:
    """The uninterrupted run: what is left, what went, and how many calls of each kind."""

    initial: dict[str, FileState]
    final: frozenset[str]
    gone_segments: frozenset[tuple[str, int]]
    swept: frozenset[str]
    counts: dict[str, int]
    write_targets: dict[str, int]


def _parse_trace(path: Path) -> tuple[Counter[str], Counter[str]]:
    counts: Counter[str] = Counter()
    targets: Counter[str] = Counter()
    line_re = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\((.*)$")
    for line in path.read_text(errors="replace").splitlines():
        if "resumed>" in line:
            continue  # the second half of an interrupted call: counted at its start
        m = line_re.match(line)
        if not m or m.group(1) not in _INJECTED:
            continue
        counts[m.group(1)] += 1
        if m.group(1) in ("write", "pwrite64", "writev"):
            fdm = re.match(r"\d+<([^>]*)>", m.group(2))
            target = os.path.basename(fdm.group(1)) if fdm else "?"
            targets[target if target in ("audit.jsonl", "offline-journal.jsonl") else "log"] += 1
    return counts, targets


def _reference(ws: _Workspace, scratch: Path) -> Reference:
    """Run uninterrupted twice: plainly (the expected end state) and under strace counting
    (must end the same: the counted calls are the ones the crash points kill at)."""
    initial = ws.reset()
    outcome = _run_plain(ws.argv(), scratch / "ref.out")
    if outcome != ("exit", 0):
        raise AssertionError(f"reference run: {outcome}: {(scratch / 'ref.out').read_text()}")
    final = _tree_state(ws.root)
    ws.reset()
    trace = scratch / "count.trace"
    outcome = _run_traced(
        ws.argv(),
        scratch / "count.out",
        ["-y", "-e", f"trace={','.join(_INJECTED)}", "-o", str(trace)],
    )
    if outcome != ("exit", 0):
        raise AssertionError(f"counting run: {outcome}: {(scratch / 'count.out').read_text()}")
    if set(_tree_state(ws.root)) != set(final):
        raise AssertionError("the counting run ended elsewhere than the plain run")
    counts, targets = _parse_trace(trace)
    before_groups = _segment_groups(list(initial))
    after_groups = _segment_groups(list(final))
    gone = frozenset(k for k in before_groups if k not in after_groups)
    swept = frozenset(
        rel
        for rel in initial
        if rel not in final
        and (
            re.search(r"-delete$", rel) is not None
            or (rel.endswith(".deleted") and _SEGMENT_FILE.match(os.path.basename(rel)))
        )
    )
    return Reference(initial, frozenset(final), gone, swept, dict(counts), dict(targets))


@dataclass(frozen=True)
class PointResult:
    scenario: str
    syscall: str
    n: int
    killed: bool
    rerun_exit: int
    problems: tuple[str, ...]


def _check_converged(ws: _Workspace, ref: Reference, copied: dict[str, FileState]) -> list[str]:
    """Every convergence rule; returns what is wrong (empty: converged)."""
    problems: list[str] = []
    final = _tree_state(ws.root)
    if set(final) != set(ref.final):
        extra = sorted(set(final) - set(ref.final))[:5]
        missing = sorted(set(ref.final) - set(final))[:5]
        problems.append(f"files differ: left over {extra}, missing {missing}")
    for rel, fs in final.items():
        was = copied.get(rel)
        if was is None:
            problems.append(f"{rel}: created")
        elif not os.path.isdir(ws.root / rel) and (was.ino, was.size, was.mtime_ns) != (
            fs.ino,
            fs.size,
            fs.mtime_ns,
        ):
            problems.append(f"{rel}: touched")
    whole = _segment_groups(list(copied))
    for key, files in _segment_groups(list(final)).items():
        if files != whole.get(key):
            problems.append(f"{key}: half-deleted ({sorted(files)} of {whole.get(key)})")
    problems += _check_audit(ws, ref)
    journal = ws.state / "offline-journal.jsonl"
    if (
        journal.exists()
        and journal.stat().st_size
        and FileExecutor(ws.state, AuditLog(ws.state / "audit.jsonl")).pending()
    ):
        problems.append("journal entries left open")
    return problems


def _check_audit(ws: _Workspace, ref: Reference) -> list[str]:
    problems: list[str] = []
    lines = list(read_audit(ws.state / "audit.jsonl"))
    intents: dict[str, dict[str, Any]] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    for line in lines:
        aid = str(line.get("action_id"))
        bucket = intents if line.get("phase") == "intent" else outcomes
        if aid in bucket:
            problems.append(f"action {aid}: two {line.get('phase')} lines")
        bucket[aid] = line
    for aid in intents:
        if aid not in outcomes:
            problems.append(f"action {aid}: intent without outcome")
    done_segments: Counter[tuple[str, int]] = Counter()
    swept_done: set[str] = set()
    for aid, out in outcomes.items():
        phase = out.get("phase")
        if phase == "refused":
            problems.append(f"action {aid}: refused: {out.get('error')}")
            continue
        if phase == "failed":
            if "interrupted before" not in str(out.get("error")):
                problems.append(f"action {aid}: failed: {out.get('error')}")
            continue
        if out.get("kind") == "swept":
            path = Path(str(out.get("path")))
            rel = os.path.relpath(path, ws.root)
            if out.get("what") == "delete_dir":
                swept_done.add(rel)
            else:
                swept_done.update(os.path.join(rel, str(n)) for n in out.get("names", []))
            continue
        log_dir = os.path.relpath(str(out.get("log_dir")), ws.root)
        key = (
            os.path.join(log_dir, f"{out.get('topic')}-{out.get('partition')}"),
            int(out.get("base_offset", -1)),
        )
        done_segments[key] += 1
    for key, n in done_segments.items():
        if n != 1:
            problems.append(f"segment {key}: {n} done lines")
    if set(done_segments) != set(ref.gone_segments):
        problems.append(
            f"done segments {sorted(set(done_segments) ^ set(ref.gone_segments))[:4]} differ "
            "from those gone"
        )
    top_swept = {r for r in ref.swept if r.endswith("-delete") or r.endswith(".deleted")}
    if not top_swept <= swept_done:
        problems.append(f"swept without a done line: {sorted(top_swept - swept_done)[:4]}")
    return problems


def _run_point(ws: _Workspace, ref: Reference, syscall: str, n: int, scratch: Path) -> PointResult:
    copied = ws.reset()
    out = scratch / "crash.out"
    kind, value = _run_traced(
        ws.argv(),
        out,
        [
            "-o",
            "/dev/null",
            "-e",
            f"trace={syscall}",
            "-e",
            f"inject={syscall}:signal=SIGKILL:when={n}",
        ],
    )
    problems: list[str] = []
    killed = (kind, value) == ("signal", signal.SIGKILL)
    if not killed:
        problems.append(f"not killed at {syscall} #{n}: {kind} {value}: {out.read_text()[-400:]}")
    rerun = scratch / "rerun.out"
    rkind, rcode = _run_plain(ws.argv(), rerun)
    if (rkind, rcode) != ("exit", 0):
        problems.append(f"re-run: {rkind} {rcode}: {rerun.read_text()[-800:]}")
    problems += _check_converged(ws, ref, copied)
    return PointResult(ws.scenario.name, syscall, n, killed, rcode, tuple(problems))


#: Filesystems the log dirs can be on: tmpfs (fast; every partition dir changed is fsync'd)
#: or loop ext4 (a journal that commits in order: a batch fsyncs only the dir it changed
#: last, ``host/fsjournal.py``), so each path's crash points are tried.
LOGS_FILESYSTEMS = ("tmpfs", "ext4")


def _logs_fs(kind: str) -> contextlib.AbstractContextManager[Path]:
    if kind == "ext4":
        return fsfixtures.loop_ext4(32 * MiB, name="logs")
    if kind == "tmpfs":
        return fsfixtures.tmpfs(32 * MiB, name="logs")
    raise ValueError(f"logs_fs must be one of {LOGS_FILESYSTEMS}, got {kind!r}")


@contextlib.contextmanager
def _workspace(scenario: Scenario, template: Path, logs_fs: str = "tmpfs") -> Iterator[_Workspace]:
    with (
        _logs_fs(logs_fs) as logs_mnt,
        fsfixtures.tmpfs(32 * MiB, name="state") as state_mnt,
    ):
        ws = _Workspace(scenario, template, logs_mnt, state_mnt, logs_fs)
        _write_config(ws)
        yield ws


def _all_points(ref: Reference) -> list[tuple[str, int]]:
    """Every (syscall, N), ordered by syscall then N."""
    return [(s, n) for s in sorted(ref.counts) for n in range(1, ref.counts[s] + 1)]


def sample_points(points: Sequence[tuple[str, int]], k: int) -> list[tuple[str, int]]:
    """``k`` points spread evenly over ``points`` (deterministic), both ends included."""
    if k >= len(points):
        return list(points)
    step = (len(points) - 1) / (k - 1)
    return [points[round(i * step)] for i in range(k)]


def run_scenario(
    scenario: Scenario,
    workdir: Path,
    select: Callable[[list[tuple[str, int]]], list[tuple[str, int]]] = list,
    workers: int = 2,
    logs_fs: str = "tmpfs",
) -> tuple[Reference, list[PointResult]]:
    """Reference + every selected crash point, split over ``workers`` forked processes;
    ``logs_fs``: what the log dirs are on (``LOGS_FILESYSTEMS``), the state dir is a tmpfs."""
    template = workdir / f"template-{scenario.name}"
    shutil.rmtree(template, ignore_errors=True)
    _prepare_template(scenario, template)
    scratch = workdir / f"scratch-{scenario.name}"
    scratch.mkdir(parents=True, exist_ok=True)
    with _workspace(scenario, template, logs_fs) as ws:
        ref = _reference(ws, scratch)
    points = select(_all_points(ref))
    chunks = [points[i::workers] for i in range(workers)]
    results: list[PointResult] = []
    pids: list[tuple[int, Path]] = []
    for w, chunk in enumerate(chunks):
        out = workdir / f"results-{scenario.name}-{w}.json"
        out.unlink(missing_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                wscratch = scratch / f"w{w}"
                wscratch.mkdir(exist_ok=True)
                # Same tree, same filesystem and size: the same ceiling as the reference's.
                with _workspace(scenario, template, logs_fs) as wws:
                    rows = [_run_point(wws, ref, s, n, wscratch).__dict__ for s, n in chunk]
                out.write_text(json.dumps(rows))
            except BaseException as exc:
                out.write_text(json.dumps({"error": repr(exc)}))
                code = 1
            finally:
                os._exit(code)
        pids.append((pid, out))
    for pid, out in pids:
        os.waitpid(pid, 0)
        data = json.loads(out.read_text()) if out.exists() else {"error": "no result file"}
        if isinstance(data, dict):
            raise RuntimeError(f"crash-point worker failed: {data['error']}")
        results += [
            PointResult(
                r["scenario"],
                r["syscall"],
                r["n"],
                r["killed"],
                r["rerun_exit"],
                tuple(r["problems"]),
            )
            for r in data
        ]
    return ref, results


def require_strace() -> None:
    if shutil.which("strace") is None:
        raise RuntimeError(
            "strace is not installed (Debian: apt-get update && apt-get install -y strace)"
        )
