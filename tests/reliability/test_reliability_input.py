"""Reliability: hostile and corrupt input on real filesystems.

Everything a log dir can hold that is not a well-formed Kafka segment — truncated or garbage
indexes and logs, names that only look like segments, FIFOs, symlinks out of the log dir,
protected and non-live partition dirs, thousands of partitions — must give a warning naming
the file, never a crash, never a deletion through a symlink, and never the deletion of a
segment that is not a closed segment. Parsers and the config loader are fuzzed with
hypothesis: they may only raise their documented error types.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diskguard.config import load_config, parse_config
from diskguard.errors import ConfigError
from diskguard.kafkalog import offsetindex, recordbatch, timeindex
from diskguard.kafkalog.model import (
    PartitionDirKind,
    parse_partition_dir,
    parse_segment_base,
    parse_segment_file,
    segment_file_name,
)
from support.cli import json_events, plan_json, run_cli
from support.configs import write_config
from support.disks import df_percent, files_under, over_ceiling
from support.fsfixtures import fill, tmpfs
from support.kafkagen import SegmentSpec, encode_batch, write_log_dir, write_partition

MiB = 1024**2
BASE_TS = 1_700_000_000_000
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# ----------------------------------------------------------------------------- helpers


SEG = SegmentSpec(records=30, payload_size=4000, records_per_batch=3, timestamp_step_ms=10)


def seg_at(minute: int) -> SegmentSpec:
    return SegmentSpec(
        records=SEG.records,
        payload_size=SEG.payload_size,
        records_per_batch=SEG.records_per_batch,
        timestamp_step_ms=SEG.timestamp_step_ms,
        first_timestamp_ms=BASE_TS + minute * 60_000,
    )


# ----------------------------------------------------------------------------- fuzz: parsers

_VALID_LOG = b"".join(
    encode_batch(o * 3, [BASE_TS + o, BASE_TS + o + 5, BASE_TS + o + 9], [b"v" * 40] * 3)
    for o in range(4)
)


def _mutated_log() -> st.SearchStrategy[bytes]:
    """A real v2 log with random bytes overwritten / cut: reaches far deeper than pure noise."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = bytearray(_VALID_LOG)
        for _ in range(draw(st.integers(0, 6))):
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] = draw(st.integers(0, 255))
        cut = draw(st.integers(0, len(data)))
        return bytes(data[:cut]) + draw(st.binary(max_size=80))

    return build()


@FUZZ
@given(data=st.one_of(st.binary(max_size=400), _mutated_log()), start=st.integers(-5, 700))
def test_fuzz_log_parser_raises_only_value_or_os_errors(
    tmp_path: Path, data: bytes, start: int
) -> None:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    for verify in (False, True):
        try:
            for header in recordbatch.iter_batches(path, start, verify_crc=verify):
                assert header.size_in_bytes > 0 and header.position >= 0
        except (ValueError, OSError):
            pass
    with contextlib.suppress(ValueError, OSError):
        recordbatch.last_batch_max_timestamp(path, max(0, start))


@FUZZ
@given(
    data=st.binary(max_size=300),
    zero_tail=st.integers(0, 4096),
    entry=st.sampled_from([8, 12]),
)
def test_fuzz_index_parsers_raise_only_value_or_os_errors(
    tmp_path: Path, data: bytes, zero_tail: int, entry: int
) -> None:
    path = tmp_path / "index"
    path.write_bytes(data)
    if zero_tail:
        os.truncate(path, len(data) + zero_tail)  # a sparse zero tail, as preallocated
    for parse in (timeindex.last_entry, offsetindex.last_entry):
        try:
            result = parse(path)
        except (ValueError, OSError):
            continue
        assert result is None or isinstance(
            result, timeindex.TimeIndexEntry | offsetindex.OffsetIndexEntry
        )


# ----------------------------------------------------------------------------- fuzz: config

_SECTIONS: dict[str, list[str]] = {
    "broker": ["log_dirs", "server_properties", "bootstrap_servers", "client", "segment_bytes"],
    "retention": [
        "disk_usage_percent",
        "target_percent",
        "max_bytes",
        "mode",
        "protect_topics",
        "assume_delete_policy",
        "check_interval",
        "usage_poll_interval",
        "offline_headroom",
        "consumer_aware",
    ],
    "flow_control": [
        "overfull_percent",
        "underfull_percent",
        "overfull_bytes",
        "underfull_bytes",
        "min_free_bytes",
        "on_change",
        "actuators",
        "quota",
    ],
    "alerts": ["low_space_percent", "low_space_bytes"],
    "ballast": ["path", "size"],
    "snapshots": ["interval", "topic", "spool_max_bytes", "host"],
    "metrics": ["listen"],
    "logging": ["format", "level"],
    "daemon": ["state_dir"],
}

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["5s", "1GiB", "-1", "abc", "/tmp", "0", "1e400", "50%", "auto", "[", "("]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def _config_dicts(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for section in draw(st.lists(st.sampled_from([*_SECTIONS, "bogus"]), max_size=4)):
        keys = [*_SECTIONS.get(section, ["x"]), "unknown_key"]
        out[section] = draw(st.dictionaries(st.sampled_from(keys), _VALUES, max_size=4))
    if draw(st.booleans()):
        out.setdefault("broker", {})["log_dirs"] = draw(
            st.lists(st.sampled_from(["/tmp", "/", "relative", "/nonexistent", "/tmp"]), max_size=3)
        )
    if draw(st.booleans()):
        out[draw(st.sampled_from(list(_SECTIONS)))] = draw(_VALUES)  # a section that is no table
    return out


@FUZZ
@given(data=_config_dicts())
def test_fuzz_parse_config_raises_only_config_error(data: dict[str, Any]) -> None:
    try:
        parse_config(data, Path("fuzz.toml"))
    except ConfigError as exc:
        assert exc.problems and all("\n" not in p for p in exc.problems), exc.problems


_TOML_LINES = st.sampled_from(
    [
        "[broker]",
        'log_dirs = ["/tmp"]',
        "[retention]",
        "disk_usage_percent = 80",
        "disk_usage_percent = inf",
        "max_bytes = inf",
        "max_bytes = nan",
        "check_interval = [1, 2]",
        "check_interval = {a = 1}",
        'check_interval = "1 fortnight"',
        "check_interval = inf",
        "usage_poll_interval = 1e308",
        "offline_headroom = -1",
        'offline_headroom = "9999999999999999999999TiB"',
        "mode = 3",
        'protect_topics = ["(unclosed"]',
        'assume_delete_policy = ["(unclosed"]',
        "[flow_control]",
        "overfull_percent = 90",
        "underfull_percent = 95",
        "[ballast]",
        'path = "relative"',
        "size = 1979-05-27T07:32:00Z",
        "[[broker]]",
        "[metrics]",
        'listen = "host:99999"',
        "= broken",
        '"\\u0000" = 1',
    ]
)


@FUZZ
@given(
    lines=st.lists(st.one_of(_TOML_LINES, st.text(max_size=30)), max_size=8),
    raw=st.binary(max_size=40),
)
def test_fuzz_load_config_raises_only_config_error(
    tmp_path: Path, lines: list[str], raw: bytes
) -> None:
    path = tmp_path / "fuzz.toml"
    for content in ("\n".join(lines).encode("utf-8", "surrogatepass"), raw):
        try:
            path.write_bytes(content)
        except UnicodeEncodeError:
            continue
        try:
            load_config(path)
        except ConfigError as exc:
            assert exc.problems and all(p.startswith(str(path)) for p in exc.problems)


# ----------------------------------------------------------------------------- fuzz: names

_NAMEISH = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda digits, sfx, extra: digits + sfx + extra,
        st.text(alphabet="0123456789٠١٢३", min_size=18, max_size=22),
        st.sampled_from([".log", ".index", ".timeindex", ".txnindex", ".snapshot", ".deleted"]),
        st.sampled_from(["", "\n", ".deleted", " ", "x"]),
    ),
    st.builds(
        lambda topic, part, extra: f"{topic}-{part}{extra}",
        st.text(alphabet="abc._-_٣", min_size=1, max_size=6),
        st.text(alphabet="0123456789٣", min_size=1, max_size=4),
        st.sampled_from(["", "\n", "-delete", ".abc-delete", ".x-future", "-stray", ".x-y-stray"]),
    ),
)


@FUZZ
@given(name=_NAMEISH)
def test_fuzz_names_never_raise(name: str) -> None:
    """Random names parse to None or to something; never an exception."""
    parse_segment_file(name)
    parse_partition_dir(name)


@FUZZ
@given(name=_NAMEISH)
def test_fuzz_a_parsed_name_is_exactly_the_name_kafka_would_write(name: str) -> None:
    """A name taken as a segment or a live partition must be the very name Kafka writes for it:
    ``00000000000000099999.log\\n`` or Arabic-Indic digits are not segments (else a stray file
    would become a fake newest segment and the real active one a deletion candidate)."""
    seg = parse_segment_file(name)
    if seg is not None:
        assert segment_file_name(*seg) == name
    part = parse_partition_dir(name)
    if part is not None and part.kind is PartitionDirKind.LIVE:
        # Kafka, too, reads "orders-03" as partition 3 (Integer.parseInt); ASCII only though.
        assert re.fullmatch(r"[a-zA-Z0-9._-]+-[0-9]+", name, re.ASCII), name
        assert int(name.rpartition("-")[2]) == part.partition


@FUZZ
@given(name=st.one_of(_NAMEISH, st.from_regex(r"\A[0-9\u0660-\u0669]{18,22}\.log\n?\Z")))
def test_fuzz_the_listings_fast_log_parse_agrees_with_the_regex(name: str) -> None:
    """``parse_segment_base`` (the listing's regex-free parse of ``.log`` names) takes exactly
    the names ``parse_segment_file`` takes as a ``.log``, with the same base offset."""
    seg = parse_segment_file(name)
    assert parse_segment_base(name) == (seg[0] if seg is not None and seg[1] == ".log" else None)


# ----------------------------------------------------------------------------- corrupt files


def test_corrupt_indexes_and_logs_warn_name_the_file_and_date_from_the_data(
    disk: Path, tmp_path: Path
) -> None:
    """One partition per kind of damage to its oldest segment; the plan must not crash, must
    name every damaged file, and must date each damaged segment from what is still readable:
    the ``.log`` batches (exact), else the ``.log`` mtime (documented fallback)."""
    log_dir = disk / "kafka-logs"
    parts = {("orders", p): [seg_at(p), seg_at(20 + p), seg_at(40 + p)] for p in range(8)}
    layout = write_log_dir(log_dir, parts)
    rng = random.Random(7)

    def first(p: int) -> Any:
        return layout.partitions[("orders", p)].segments[0]

    # p0: time index cut inside its only entry (fewer than 12 bytes: no whole entry).
    s = first(0)
    s.timeindex_path.write_bytes(s.timeindex_path.read_bytes()[:7])
    # p1: time index garbage that breaks Kafka's sanity check (last < first).
    s = first(1)
    s.timeindex_path.write_bytes(struct.pack(">qi", BASE_TS * 3, 5) + struct.pack(">qi", 17, 9))
    # p2: time index gone and .log pure noise.
    s = first(2)
    s.timeindex_path.unlink()
    s.log_path.write_bytes(bytes(rng.randrange(1, 256) for _ in range(20_000)))
    # p3: .log cut in the middle of its last batch, time index gone.
    s = first(3)
    s.timeindex_path.unlink()
    data = s.log_path.read_bytes()
    s.log_path.write_bytes(data[: s.batches[-1].position + 30])
    # p4: time index holds only "no timestamp" (-1) entries.
    s = first(4)
    s.timeindex_path.write_bytes(struct.pack(">qi", -1, 0) * 3)
    # p5: empty .log and empty time index: nothing but the mtime is left.
    s = first(5)
    s.log_path.write_bytes(b"")
    s.timeindex_path.write_bytes(b"")
    os.utime(s.log_path, (BASE_TS / 1000 + 5 * 60, BASE_TS / 1000 + 5 * 60))
    # p6: garbage offset index (points into the middle of a batch) and a corrupt time index.
    s = first(6)
    s.index_path.write_bytes(struct.pack(">ii", 1, 7) + struct.pack(">ii", 2, 61))
    s.timeindex_path.write_bytes(struct.pack(">qi", 5, 1) + struct.pack(">qi", 1, 0))
    # p7: untouched control.

    limit = over_ceiling(disk, cushion=20)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
    plan, stderr = plan_json(cfg)
    by_part = {d["partition"]: d for d in plan["deletions"] if d["base_offset"] == 0}
    assert set(by_part) == set(range(8)), "every oldest segment is a candidate"

    true_max = {p: first(p).max_timestamp_ms for p in range(8)}
    # Exact age from the .log wherever the .log is readable.
    for p in (0, 1, 4, 6, 7):
        assert by_part[p]["max_timestamp_ms"] == true_max[p], (p, by_part[p])
    assert by_part[7]["timestamp_source"] == "timeindex"
    for p in (0, 1, 4, 6):
        assert by_part[p]["timestamp_source"] == "log", (p, by_part[p])
    # The cut .log still yields its complete batches: the last whole batch's max.
    assert by_part[3]["timestamp_source"] == "log"
    assert by_part[3]["max_timestamp_ms"] == first(3).batches[-2].max_timestamp_ms
    # Unreadable .log: the mtime, with a warning naming the .log.
    assert by_part[2]["timestamp_source"] == "mtime"
    assert by_part[5]["timestamp_source"] == "mtime"
    assert by_part[5]["max_timestamp_ms"] == BASE_TS + 5 * 60_000
    assert str(first(2).log_path) in stderr
    assert str(first(1).timeindex_path) in stderr
    assert str(first(5).timeindex_path) in stderr
    # Global order is by the dates found (p2, dated "now" by its mtime, holds back its
    # later segments: only a prefix of a partition may go).
    ages = [d["max_timestamp_ms"] for d in plan["deletions"] if d["partition"] != 2]
    assert ages == sorted(ages)

    before = files_under(log_dir)
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    after = files_under(log_dir)
    # Only whole closed segments went (each partition keeps its active segment).
    for p in range(8):
        active = layout.partitions[("orders", p)].active
        assert os.path.exists(active.log_path), p
    gone = set(before) - set(after)
    assert all(parse_segment_file(os.path.basename(g)) for g in gone), gone


def test_truncated_time_index_is_not_trusted(disk: Path, tmp_path: Path) -> None:
    """A ``.timeindex`` whose size is not a multiple of 12 is corrupt (Kafka's
    ``TimeIndex.sanityCheck`` throws and the broker rebuilds it). Trusting its last whole entry
    makes the segment look older than it is, by up to its own time span."""
    log_dir = disk / "kafka-logs"
    spec = SegmentSpec(records=60, payload_size=2000, records_per_batch=2, timestamp_step_ms=60_000)
    layout = write_log_dir(log_dir, {("orders", 0): [spec, seg_at(600)]})
    s = layout.partitions[("orders", 0)].segments[0]
    raw = s.timeindex_path.read_bytes()
    assert len(raw) >= 36, "needs several time index entries"
    s.timeindex_path.write_bytes(raw[:-5])  # the last entry cut mid-way
    limit = over_ceiling(disk, cushion=20)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
    plan, _stderr = plan_json(cfg)
    d = plan["deletions"][0]
    assert d["max_timestamp_ms"] == s.max_timestamp_ms, (
        f"dated {(s.max_timestamp_ms - d['max_timestamp_ms']) / 60_000:.0f} min too old "
        f"from a truncated index ({d['timestamp_source']})"
    )


# ----------------------------------------------------------------------------- lookalikes


def test_names_that_only_look_like_segments_are_never_touched(disk: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "precious.bin"
    victim.write_bytes(b"do not delete" * 1000)
    log_dir = disk / "kafka-logs"
    layout = write_log_dir(
        log_dir, {("orders", p): [seg_at(p), seg_at(10 + p), seg_at(20 + p)] for p in range(2)}
    )
    part = layout.partitions[("orders", 0)].path
    odd = {
        "0000000000000000000.log": "19 digits",
        "000000000000000000000.log": "21 digits",
        "0000000000000000000a.log": "not digits",
        "00000000000000000000.LOG": "upper-case suffix",
        "00000000000000000000.log.swap": "swap file",
        "00000000000000000000.log.cleaned": "cleaner output",
    }
    for name in odd:
        (part / name).write_bytes(_VALID_LOG)
    (part / "00000000000000099990.log").mkdir()  # a directory named like a newer segment
    (part / "00000000000000099990.log" / "inside").write_bytes(b"x")
    (part / "00000000000000099991.log").symlink_to(victim)  # a symlink named like one
    os.mkfifo(part / "00000000000000099992.log")  # a FIFO named like one
    limit = over_ceiling(disk, cushion=25)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")

    plan, _stderr = plan_json(cfg)
    chosen = {(d["partition"], d["base_offset"]) for d in plan["deletions"]}
    actives = {(p, layout.partitions[("orders", p)].active.base_offset) for p in range(2)}
    assert not chosen & actives, "the real active segment must stay the active one"
    assert all(b < 99990 for _p, b in chosen)

    proc = run_cli("enforce", "--once", "-c", str(cfg), timeout=60)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for name in odd:
        assert (part / name).read_bytes() == _VALID_LOG, name
    assert (part / "00000000000000099990.log" / "inside").exists()
    assert os.path.islink(part / "00000000000000099991.log")
    assert victim.read_bytes() == b"do not delete" * 1000
    for p in range(2):
        assert layout.partitions[("orders", p)].active.log_path.exists()


def test_a_stray_name_with_a_newline_never_makes_the_active_segment_deletable(
    disk: Path, tmp_path: Path
) -> None:
    log_dir = disk / "kafka-logs"
    layout = write_log_dir(log_dir, {("orders", 0): [seg_at(0), seg_at(10), seg_at(20)]})
    lay = layout.partitions[("orders", 0)]
    part = lay.path
    (part / "00000000000000099999.log\n").write_bytes(b"")
    (part / ("٠" * 15 + "88888.log")).write_bytes(b"")
    limit = over_ceiling(disk, cushion=25)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode in (0, 1), proc.stderr
    assert lay.active.log_path.exists(), "the real active segment was deleted"


def test_a_fifo_named_like_an_index_never_hangs_a_scan(disk: Path, tmp_path: Path) -> None:
    log_dir = disk / "kafka-logs"
    layout = write_log_dir(log_dir, {("orders", 0): [seg_at(0), seg_at(10), seg_at(20)]})
    seg = layout.partitions[("orders", 0)].segments[0]
    seg.timeindex_path.unlink()
    os.mkfifo(seg.timeindex_path)
    limit = over_ceiling(disk, cushion=20)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
    try:
        proc = run_cli("plan", "-c", str(cfg), "--json", timeout=8)
    except subprocess.TimeoutExpired:
        pytest.fail("plan hung opening a FIFO named like a .timeindex")
    assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------------------------------- symlinks out


def test_symlinks_out_of_the_log_dir_are_never_followed_or_deleted_through(
    disk: Path, tmp_path: Path
) -> None:
    """The oldest data of all sits outside, reached through symlinks: a partition dir that is a
    symlink, and segment files that are symlinks. Over the ceiling, offline, nothing outside
    may go, and the planner must not even count it."""
    elsewhere = Path(tempfile.mkdtemp(prefix="diskguard-elsewhere-"))
    try:
        outside = write_partition(elsewhere, "orders", 9, [seg_at(-500), seg_at(-400), seg_at(0)])
        outside_file = elsewhere / "outside.log"
        outside_file.write_bytes(_VALID_LOG)
        outside_before = files_under(elsewhere)

        log_dir = disk / "kafka-logs"
        layout = write_log_dir(
            log_dir, {("orders", p): [seg_at(p), seg_at(10 + p), seg_at(20 + p)] for p in range(3)}
        )
        (log_dir / "orders-9").symlink_to(outside.path, target_is_directory=True)
        # Segment files that are symlinks to outside: a whole segment, and one index of a
        # real segment (that segment must then be refused, never deleted through the link).
        p1 = layout.partitions[("orders", 1)].path
        (p1 / "00000000000000000005.log").symlink_to(outside_file)
        s2 = layout.partitions[("orders", 2)].segments[0]
        s2.index_path.unlink()
        s2.index_path.symlink_to(outside.segments[0].index_path)

        limit = over_ceiling(disk, cushion=25)
        cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
        plan, stderr = plan_json(cfg)
        assert all(d["partition"] != 9 for d in plan["deletions"])
        assert f"{log_dir / 'orders-9'}: symlink in log dir, not followed" in stderr
        assert all(not f.startswith(str(elsewhere)) for d in plan["deletions"] for f in d["files"])

        proc = run_cli("enforce", "--once", "-c", str(cfg))
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        assert files_under(elsewhere) == outside_before, "something outside the log dir changed"
        assert all(p.exists() for seg in outside.segments for p in seg.files)
        assert os.path.islink(s2.index_path) and s2.log_path.exists(), "deleted through a link"
        events = json_events(proc.stdout)
        refused = [e for e in events if e["event"] == "offline_refused" and e["partition"] == 2]
        assert refused and "not a regular file" in refused[0]["reason"]
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


# ----------------------------------------------------------------------------- special dirs


def test_protected_and_non_live_partition_dirs_are_never_deleted(
    disk: Path, tmp_path: Path
) -> None:
    log_dir = disk / "kafka-logs"
    specs = [seg_at(-1000), seg_at(-900), seg_at(-800)]  # the oldest data on the disk
    layout = write_log_dir(
        log_dir,
        {
            ("__consumer_offsets", 0): specs,
            ("__transaction_state", 3): specs,
            ("_schemas", 0): specs,
            **{("orders", p): [seg_at(p), seg_at(10 + p), seg_at(20 + p)] for p in range(2)},
        },
    )
    for name in ("orders-7.0a1b2c-future", "orders-8.0a1b2c-stray", "orders-5-future"):
        write_partition(log_dir, "x", 0, specs)
        (log_dir / "x-0").rename(log_dir / name)
    keep = {
        name: files_under(log_dir / name)
        for name in os.listdir(log_dir)
        if (log_dir / name).is_dir() and not re.fullmatch(r"orders-[0-9]+", name)
    }
    limit = over_ceiling(disk, cushion=25)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
    plan, _ = plan_json(cfg)
    assert {d["topic"] for d in plan["deletions"]} == {"orders"}
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    for name, before in keep.items():
        assert files_under(log_dir / name) == before, name
    assert layout.partitions[("__consumer_offsets", 0)].segments[0].log_path.exists()


def test_offline_a_delete_dir_is_not_counted_as_on_its_way_out(disk: Path, tmp_path: Path) -> None:
    log_dir = disk / "kafka-logs"
    write_log_dir(log_dir, {("orders", p): [seg_at(p)] * 3 for p in range(3)})
    doomed = log_dir / "old-0.3f2a9c-delete"
    doomed.mkdir()
    fill(doomed / "00000000000000000000.log", 8 * MiB)
    limit = over_ceiling(disk, cushion=3)
    cfg = write_config(
        tmp_path, [log_dir], disk_usage_percent=limit, mode="offline", offline_headroom=0
    )
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode in (0, 1), proc.stderr
    os.sync()
    assert proc.returncode == 1 or df_percent(disk) <= limit, (
        f"exit {proc.returncode} (done) but df {df_percent(disk):.2f}% > ceiling {limit}%"
    )


# ----------------------------------------------------------------------------- many partitions


def test_five_thousand_partitions(tmp_path: Path) -> None:
    """5,000 partition dirs (two tiny segments each) on a tmpfs: plan and enforce stay quick
    (a generous functional deadline) and pick only the oldest closed segments."""
    with tmpfs(256 * MiB) as mount:
        log_dir = mount / "kafka-logs"
        log_dir.mkdir()
        tindex = struct.Struct(">qi")
        started = time.monotonic()
        for i in range(5000):
            topic, p = f"t{i % 50}", i // 50
            d = log_dir / f"{topic}-{p}"
            d.mkdir()
            ts = BASE_TS + i * 1000
            batch = encode_batch(0, [ts], [b"v" * 2000])
            (d / "00000000000000000000.log").write_bytes(batch)
            (d / "00000000000000000000.index").write_bytes(b"")
            (d / "00000000000000000000.timeindex").write_bytes(tindex.pack(ts, 0))
            (d / "00000000000000000001.log").write_bytes(encode_batch(1, [ts + 1], [b"w"]))
        print(f"wrote 5000 partitions in {time.monotonic() - started:.1f}s")
        limit = over_ceiling(mount, cushion=2, share=0.5)
        cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
        started = time.monotonic()
        plan, _ = plan_json(cfg)
        took = time.monotonic() - started
        print(f"plan over 5000 partitions: {took:.2f}s, {len(plan['deletions'])} chosen")
        chosen = plan["deletions"]
        assert chosen and all(d["base_offset"] == 0 for d in chosen)
        ages = [d["max_timestamp_ms"] for d in chosen]
        assert ages == sorted(ages) and ages[0] == BASE_TS
        proc = run_cli("enforce", "--once", "-c", str(cfg), timeout=120)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert df_percent(mount) <= limit


def test_a_garbage_offset_index_still_dates_the_segment_from_its_log(
    disk: Path, tmp_path: Path
) -> None:
    log_dir = disk / "kafka-logs"
    layout = write_log_dir(log_dir, {("orders", 0): [seg_at(0), seg_at(10), seg_at(20)]})
    s = layout.partitions[("orders", 0)].segments[0]
    s.timeindex_path.write_bytes(b"")
    s.index_path.write_bytes(struct.pack(">ii", 1, 4))  # position 4: inside the first header
    limit = over_ceiling(disk, cushion=20)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
    plan, _stderr = plan_json(cfg)
    d = plan["deletions"][0]
    assert (d["timestamp_source"], d["max_timestamp_ms"]) == ("log", s.max_timestamp_ms)
