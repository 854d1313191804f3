"""Bytes as the device sees them, on real loop-mounted ext4.

- Excess is per *device*: a log dir reached through a bind mount of the same ext4 is the same
  filesystem, with one heap and one excess, however many mount points lead there.
- A segment's bytes are what deleting it frees: files with another hard link free nothing, so
  such a segment is never chosen, and two names of one inode are counted once.
- ``enforce --once`` judges the usage measured after the cycle, not the plan's hope.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from diskguard.broker.client import BrokerClient
from diskguard.config import load_config
from diskguard.daemon.filesystems import Filesystems
from diskguard.host import fsusage
from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir, Partition, SegmentInfo
from diskguard.kafkalog.scan import scan
from diskguard.logs import configure_logging
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.limits import Limits
from diskguard.retention.planner import plan_filesystem
from support.cli import json_events, run_cli
from support.configs import write_config
from support.disks import df_percent, disk_free, over_ceiling
from support.fakes import AcceptingAdmin
from support.fsfixtures import fill
from support.kafkagen import SegmentSpec, hold_lock, write_log_dir
from support.logdirs import build, expected_order

MiB = 1024**2
BASE_TS = 1_700_000_000_000


@contextlib.contextmanager
def bind_mount(source: Path, target: Path) -> Iterator[Path]:
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def files_under(root: Path) -> dict[str, int]:
    return {str(p): os.lstat(p).st_ino for p in root.rglob("*") if p.is_file()}


# -- item 3: one heap per device --------------------------------------------------------------


def two_log_dirs(mount: Path) -> dict[tuple[str, str, int, int], tuple[int, list[Path]]]:
    """Two log dirs on one ext4, timestamps interleaved across them: dir, topic, partition,
    base offset -> (max timestamp, files)."""
    truth = {}
    for d_index, name in enumerate(["logs-a", "logs-b"]):
        parts = {}
        for t_index, topic in enumerate([f"{name}-orders", f"{name}-clicks"]):
            for p in range(2):
                parts[(topic, p)] = [
                    SegmentSpec(
                        records=25,
                        payload_size=10_000,
                        first_timestamp_ms=BASE_TS
                        + (s * 8 + t_index * 4 + p * 2 + d_index) * 60_000,
                        timestamp_step_ms=10,
                        records_per_batch=5,
                    )
                    for s in range(4)
                ]
        layout = write_log_dir(mount / name, parts)
        for (topic, p), part in layout.partitions.items():
            for seg in part.closed:
                truth[(name, topic, p, seg.base_offset)] = (seg.max_timestamp_ms, list(seg.files))
    return truth


def test_a_bind_mount_of_the_same_device_is_one_filesystem_with_one_excess(
    disk: Path, tmp_path: Path
) -> None:
    truth = two_log_dirs(disk)
    limit = over_ceiling(disk, 4, digits=1)
    with bind_mount(disk, tmp_path / "bind") as bind:
        log_dirs = [disk / "logs-a", bind / "logs-b"]
        cfg = write_config(
            tmp_path, log_dirs, disk_usage_percent=limit, mode="offline", offline_headroom=0
        )

        proc = run_cli("plan", "-c", str(cfg), "--json")
        assert proc.returncode == 0, proc.stderr
        plan = json.loads(proc.stdout)
        assert len(plan["filesystems"]) == 1, plan["filesystems"]
        fs = plan["filesystems"][0]
        assert fs["mount"] == str(disk)  # the first mount point seen for the device
        assert fs["log_dirs"] == [str(d) for d in log_dirs]
        assert {d["mount"] for d in plan["deletions"]} == {str(disk)}
        chosen = [
            (Path(d["log_dir"]).name, d["topic"], d["partition"], d["base_offset"])
            for d in plan["deletions"]
        ]
        order = sorted(truth, key=lambda k: (truth[k][0], k))
        assert chosen == order[: len(chosen)], "not the global-oldest prefix across both dirs"
        assert {c[0] for c in chosen} == {"logs-a", "logs-b"}
        covered = sum(d["bytes"] for d in plan["deletions"])
        assert covered >= fs["excess_bytes"] > covered - plan["deletions"][-1]["bytes"]

        before = {**files_under(disk / "logs-a"), **files_under(disk / "logs-b")}
        proc = run_cli("enforce", "--once", "-c", str(cfg))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert df_percent(disk) <= limit
        after = {**files_under(disk / "logs-a"), **files_under(disk / "logs-b")}
        gone = set(before) - set(after)
        assert gone == {str(f) for c in chosen for f in truth[c][1]}
        cycles = [e for e in json_events(proc.stdout) if e["event"] == "retention_cycle"]
        assert len(cycles) == 1 and cycles[0]["mount"] == str(disk)


def test_the_same_log_dir_through_two_paths_is_scanned_once(disk: Path, tmp_path: Path) -> None:
    two_log_dirs(disk)
    with bind_mount(disk, tmp_path / "bind") as bind:
        result = scan([disk / "logs-a", bind / "logs-a"], [])
    assert len(result.filesystems) == 1
    assert [d.path for d in result.filesystems[0].log_dirs] == [str(disk / "logs-a")]
    assert any(str(bind / "logs-a") in w and "same directory" in w for w in result.warnings)


def test_group_by_device_keeps_config_order_and_isolates_unreadable_paths(
    disk: Path, tmp_path: Path
) -> None:
    (disk / "a").mkdir()
    (disk / "b").mkdir()
    (tmp_path / "c").mkdir()
    with bind_mount(disk, tmp_path / "bind") as bind:
        paths = [bind / "b", tmp_path / "c", disk / "a", tmp_path / "gone"]
        groups = fsusage.group_by_device(paths)
    assert [(g.mount, g.paths) for g in groups] == [
        (str(bind), (str(bind / "b"), str(disk / "a"))),  # the first path's mount labels it
        (fsusage.mount_of(tmp_path).mount_point, (str(tmp_path / "c"),)),
        (fsusage.mount_of(tmp_path).mount_point, (str(tmp_path / "gone"),)),
    ]
    assert groups[0].dev == os.stat(disk).st_dev and groups[2].dev is None


def test_the_daemon_watches_one_filesystem_per_device(disk: Path, tmp_path: Path) -> None:
    two_log_dirs(disk)
    with bind_mount(disk, tmp_path / "bind") as bind:
        log_dirs = [disk / "logs-a", bind / "logs-b"]
        config = load_config(write_config(tmp_path, log_dirs, disk_usage_percent=99.0))
        guarded = Filesystems(config.broker.log_dirs)
        assert guarded.mounts == {str(disk): [str(d) for d in log_dirs]}
        assert list(guarded.usage()) == [str(disk)]


# -- item 5: hard links ---------------------------------------------------------------------


def link_out(files: list[Path], backup: Path) -> None:
    backup.mkdir(exist_ok=True)
    for f in files:
        os.link(f, backup / f"{f.parent.name}-{f.name}")


def test_hard_linked_segments_are_never_chosen_and_enforce_exits_1_without_repeat(
    disk: Path, tmp_path: Path
) -> None:
    log_dir, truth = build(disk)
    # A backup tool's hard links: deleting the log dir's names frees none of these bytes.
    link_out([f for k in expected_order(truth) for f in truth[k][1]], disk / "backup")
    limit = over_ceiling(disk, 4, digits=1)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")

    proc = run_cli("plan", "-c", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["deletions"] == []
    assert plan["filesystems"][0]["unreachable_bytes"] > 0
    assert "hard-linked elsewhere" in proc.stderr and "00000000000000000000" in proc.stderr

    before = files_under(log_dir)
    for _run in range(2):
        proc = run_cli("enforce", "--once", "-c", str(cfg))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert files_under(log_dir) == before, "deleted a segment that frees nothing"
        assert not [e for e in json_events(proc.stdout) if e["event"] == "segment_deleted"]


def test_a_hard_linked_head_stops_its_partition_and_the_rest_is_planned(
    disk: Path, tmp_path: Path
) -> None:
    log_dir, truth = build(disk)
    order = expected_order(truth)
    pinned = order[0]  # the globally oldest segment
    assert pinned[:2] == ("orders", 0)
    link_out(truth[pinned][1][:1], disk / "backup")  # only its .log has another link
    limit = over_ceiling(disk, 2, digits=1)
    cfg = write_config(
        tmp_path, [log_dir], disk_usage_percent=limit, mode="offline", offline_headroom=0
    )

    proc = run_cli("plan", "-c", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr
    chosen = [
        (d["topic"], d["partition"], d["base_offset"]) for d in json.loads(proc.stdout)["deletions"]
    ]
    rest = [k for k in order if k[:2] != ("orders", 0)]
    assert chosen and chosen == rest[: len(chosen)], "orders-0 must go no further this cycle"
    assert f"orders-0/{pinned[2]:020d}" in proc.stderr

    before = files_under(log_dir)
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert df_percent(disk) <= limit
    gone = set(before) - set(files_under(log_dir))
    assert gone == {str(f) for k in chosen for f in truth[k][1]}


def test_two_names_of_one_inode_are_counted_once(disk: Path) -> None:
    layout = write_log_dir(
        disk / "logs",
        {("orders", 0): [SegmentSpec(records=20, payload_size=5_000)] * 3},
        log_start_offsets={("orders", 0): 20},  # the first segment is pending reclaim
    )
    part = layout.partitions[("orders", 0)]
    first, second = part.segments[0], part.segments[1]
    # Another name inside the log dir for a live segment and for the top-level checkpoint dir
    # entry: the same inodes, not more bytes.
    os.link(second.log_path, part.path / "copy-of-second.bak")
    os.link(second.log_path, disk / "logs" / "second.bak")
    # The segment pending reclaim also has a name outside the log dir: removing it frees nothing.
    link_out([first.log_path], disk / "backup")
    # A -delete dir whose two names of one inode both go with it: freed once.
    gone_dir = disk / "logs" / "orders-1.0123456789abcdef0123456789abcdef-delete"
    gone_dir.mkdir()
    fill(gone_dir / "00000000000000000000.log", 256 * 1024)
    os.link(gone_dir / "00000000000000000000.log", gone_dir / "00000000000000000000.log.deleted")

    def allocated(path: Path) -> int:
        return os.lstat(path).st_blocks * 512

    seen: dict[tuple[int, int], int] = {}
    for root, _dirs, names in os.walk(disk / "logs"):
        for name in names:
            st = os.lstat(os.path.join(root, name))
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512

    result = scan([disk / "logs"], [], full=True)
    (log_dir,) = result.filesystems[0].log_dirs
    assert log_dir.kafka_bytes == sum(seen.values())
    first_freeable = sum(allocated(f) for f in first.files if f != first.log_path)
    assert log_dir.pending_reclaim_bytes == first_freeable + allocated(
        gone_dir / "00000000000000000000.log"
    )
    topic = result.topics_by_mount[str(disk)]["orders"]
    unique_in_partition = {
        (os.lstat(p).st_dev, os.lstat(p).st_ino): allocated(p)
        for p in part.path.iterdir()
        if p.is_file()
    }
    assert topic.bytes == sum(unique_in_partition.values())


def test_the_planner_never_chooses_a_segment_that_frees_nothing() -> None:
    """Pure planner: a head with shared files stops its partition; the rest still plans."""
    usage = FilesystemUsage("/d", "/dev/x", 100 * MiB, 90 * MiB, 10 * MiB)
    parts = [
        Partition("/d/k", "a", 0, "/d/k/a-0", (0, 10, 20)),
        Partition("/d/k", "b", 0, "/d/k/b-0", (0, 10, 20)),
    ]
    fs = Filesystem(usage, (LogDir("/d/k", "/d", tuple(parts)),))

    def read(part: Partition, base: int) -> SegmentInfo:
        files = (f"{part.path}/{base:020d}.log",)
        shared = files if (part.topic, base) == ("a", 0) else ()
        age = {("a", 0): 1, ("b", 0): 2, ("a", 10): 3, ("b", 10): 4}[(part.topic, base)]
        return SegmentInfo(0 if shared else 4 * MiB, age, "timeindex", files, shared)

    fs_plan, chosen = plan_filesystem(fs, Limits(80.0, 70.0), read)
    assert [(d.topic, d.base_offset) for d in chosen] == [("b", 0), ("b", 10)]
    assert fs_plan.unreachable_bytes > 0


# -- exit code and retention_cycle from the usage measured after the cycle -------------------


def test_enforce_exit_code_is_the_measured_usage_not_the_plans_hope(
    disk: Path, tmp_path: Path
) -> None:
    log_dir, _truth = build(disk)
    limit = over_ceiling(disk, 4, digits=1)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
    proc = run_cli("plan", "-c", str(cfg), "--json")
    chosen = json.loads(proc.stdout)["deletions"]
    assert chosen
    # Another process (a backup reader, `tail -f`) has the chosen files open: unlinking them
    # frees nothing until it closes them, so df stays over the limit.
    fds = [os.open(f, os.O_RDONLY) for d in chosen for f in d["files"]]
    try:
        proc = run_cli("enforce", "--once", "-c", str(cfg))
        measured = df_percent(disk)
    finally:
        for fd in fds:
            os.close(fd)
    deleted = [e for e in json_events(proc.stdout) if e["event"] == "segment_deleted"]
    assert len(deleted) == len(chosen)
    assert measured > limit
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{disk}: over its {limit}% limit after the cycle" in proc.stderr
    (cycle,) = [e for e in json_events(proc.stdout) if e["event"] == "retention_cycle"]
    assert cycle["usage_after"] > limit
    assert abs(cycle["usage_after"] - measured) < 0.5


class FillingAdmin(AcceptingAdmin):
    """Accepts DeleteRecords while producers fill the disk faster than the broker will free."""

    def __init__(self, filler: Path, nbytes: int) -> None:
        super().__init__()
        self.filler, self.nbytes = filler, nbytes

    def delete_records(self, tps: Any, **kwargs: Any) -> Any:
        fill(self.filler, self.nbytes)
        return super().delete_records(tps, **kwargs)


def test_broker_mode_exit_code_and_event_use_measured_usage_net_of_pending(
    disk: Path, tmp_path: Path
) -> None:
    log_dir, _truth = build(disk)
    limit = over_ceiling(disk, 4, digits=1)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="broker")
    cfg.write_text(
        cfg.read_text().replace("[retention]", 'bootstrap_servers = "127.0.0.1:1"\n[retention]')
    )
    admin = FillingAdmin(disk / "growth", int(disk_free(disk) * 0.5))
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    try:
        client = BrokerClient("127.0.0.1:1", {}, timeout=2.0, admin=admin)
        with hold_lock(log_dir), RetentionCycle(load_config(cfg), broker=client) as runtime:
            outcome = runtime.enforce()
    finally:
        configure_logging()
    assert outcome.results and all(r.ok for r in outcome.results)
    assert outcome.plan.reachable  # the plan covered the excess it saw...
    measured = df_percent(disk)
    assert measured > limit + 4  # ...but the disk grew past what the broker will remove
    assert outcome.exit_code() == 1
    (cycle,) = [e for e in json_events(out.getvalue()) if e["event"] == "retention_cycle"]
    assert cycle["usage_after"] > cycle["usage_before"]
    assert abs(cycle["usage_after"] - measured) < 0.5
