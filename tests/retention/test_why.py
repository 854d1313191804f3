"""The why of every deletion, from the planner to ``plan``, the audit log, ``diskguard audit``
and the events: one test per ``Why`` field on the pure planner, then the whole way on a real
tmpfs with the real commands."""

from __future__ import annotations

import dataclasses
import heapq
import json
from collections.abc import Callable
from pathlib import Path

from diskguard.kafkalog.model import Filesystem
from diskguard.retention.limits import Limits
from diskguard.retention.order import HeadKey, Why, tie_breaker
from diskguard.retention.planner import Deletion, plan_filesystem
from support.cli import json_events, plan_json, run_cli
from support.configs import write_config
from support.fsfixtures import fill
from support.kafkagen import SegmentSpec, write_log_dir
from support.planning import FakeReader, MiB, make_fs, part

# 1000 MiB, 900 used = 90 % over an 88 % ceiling, 87 % target: 30 MiB must go.
USED, AVAIL = 900 * MiB, 100 * MiB
SEGS = {
    ("a", 0, 0): (10 * MiB, 1000),
    ("a", 0, 100): (10 * MiB, 4000),
    ("a", 0, 200): (10 * MiB, 6000),
    ("b", 0, 0): (10 * MiB, 2000),
    ("b", 0, 50): (10 * MiB, 3000),
}
PARTS = [part("a", 0, [0, 100, 200, 300]), part("b", 0, [0, 50, 90])]


def _whys() -> list[tuple[str, Why]]:
    fs = make_fs(PARTS, used=USED, avail=AVAIL)
    _plan, chosen = plan_filesystem(fs, Limits(88.0, 87.0), FakeReader(SEGS))
    return [(f"{d.topic}-{d.partition}@{d.base_offset}", _why(d)) for d in chosen]


def _why(d: Deletion) -> Why:
    assert d.why is not None, d
    return d.why


def test_why_rule_and_the_limit_in_force() -> None:
    (_, first), *_ = _whys()
    assert (first.rule, first.limit_percent, first.target_percent, first.max_bytes) == (
        "disk_usage_percent",
        88.0,
        87.0,
        None,
    )
    # A log dir over its byte budget: that rule, and the budget as the limit.
    fs = make_fs([part("a", 0, [0, 10, 20])], used=10 * MiB, avail=990 * MiB, kafka_bytes=35 * MiB)
    segs = {("a", 0, 0): (10 * MiB, 1), ("a", 0, 10): (10 * MiB, 2)}
    _p, chosen = plan_filesystem(fs, Limits(100.0, 100.0, max_bytes=20 * MiB), FakeReader(segs))
    why = _why(chosen[0])
    assert (why.rule, why.trigger, why.max_bytes) == ("max_bytes", "max_bytes", 20 * MiB)
    assert why.excess_bytes == 15 * MiB  # 35 MiB of Kafka data over a 20 MiB budget


def test_why_trigger_measured_or_predicted() -> None:
    assert all(w.trigger == "usage" and w.predicted_usage_percent is None for _, w in _whys())
    # Under the ceiling today, over it by the broker-mode forecast.
    fs = make_fs(PARTS, used=860 * MiB, avail=140 * MiB)
    forecast = Limits(
        88.0, 87.0, growth_bytes_per_s=2 * MiB, reclaim_latency_s=10.0, reclaim_period_s=5.0
    )
    _plan, chosen = plan_filesystem(fs, forecast, FakeReader(SEGS))
    why = _why(chosen[0])
    assert why.trigger == "predicted" and why.usage_percent == 86.0
    assert why.predicted_usage_percent == 88.0  # 860 + 2 MiB/s x 10 s = 880 of 1000 MiB


def test_why_usage_and_excess_as_the_plan_saw_them() -> None:
    for _, why in _whys():
        assert why.usage_percent == 90.0
        assert why.excess_bytes == 30 * MiB
    # Pending reclaim counts as gone: the excess the rule had is net of it.
    fs = make_fs(PARTS, used=USED, avail=AVAIL, pending=5 * MiB)
    _plan, chosen = plan_filesystem(fs, Limits(88.0, 87.0), FakeReader(SEGS))
    assert _why(chosen[0]).excess_bytes == 25 * MiB


def test_why_rank_is_the_place_in_the_global_order() -> None:
    assert [(name, w.rank) for name, w in _whys()] == [("a-0@0", 1), ("b-0@0", 2), ("b-0@50", 3)]


def test_why_tie_breaker_and_before_name_the_next_candidate() -> None:
    assert [(n, w.tie_breaker, w.before) for n, w in _whys()] == [
        ("a-0@0", "older", "b-0@0"),
        ("b-0@0", "older", "b-0@50"),
        ("b-0@50", "older", "a-0@100"),  # the first candidate left: not chosen, named
    ]
    # Equally old: consumed first, then led here, then by name.
    same = {("a", 0, 0): (MiB, 5), ("a", 1, 0): (MiB, 5), ("b", 0, 0): (MiB, 5)}
    parts = [part("a", 0, [0, 10]), part("a", 1, [0, 10]), part("b", 0, [0, 10])]
    three = make_fs(parts, used=99 * MiB, avail=1 * MiB)
    two = make_fs(parts[:2], used=99 * MiB, avail=1 * MiB)

    def first(fs: Filesystem, **plan: object) -> tuple[str, str | None, str | None]:
        _p, chosen = plan_filesystem(fs, Limits(98.5, 98.5), FakeReader(same), **plan)  # type: ignore[arg-type]
        why = _why(chosen[0])
        return f"{chosen[0].topic}-{chosen[0].partition}", why.tie_breaker, why.before

    assert first(three) == ("a-0", "name", "a-1@0")
    # g has read all of a-1's segment but not a-0's: a-1 first, and b-0 (g does not
    # consume b) next by name; on its own, a-1 before a-0 because it is consumed.
    committed = {("a", 0): {"g": 3}, ("a", 1): {"g": 10}}
    assert first(three, committed=committed) == ("a-1", "name", "b-0@0")
    assert first(two, committed=committed) == ("a-1", "consumed", "a-0@0")
    assert first(three, led_here={("b", 0)}) == ("b-0", "led_here", "a-0@0")
    # Nothing after it: no tie-breaker, no next.
    lone = make_fs([part("a", 0, [0, 10])], used=99 * MiB, avail=1 * MiB)
    _p, chosen = plan_filesystem(lone, Limits(98.5, 98.5), FakeReader({("a", 0, 0): (MiB, 1)}))
    assert (_why(chosen[0]).tie_breaker, _why(chosen[0]).before) == (None, None)


def test_the_heap_key_is_a_named_tuple_compared_as_a_tuple() -> None:
    older = HeadKey(1, False, False, "b", 0, 0, "/d")
    newer = HeadKey(2, False, False, "a", 0, 0, "/d")
    assert isinstance(older, tuple) and older < newer
    assert HeadKey.__lt__ is tuple.__lt__  # no Python-level comparison on the heap
    heap = [newer, older]
    heapq.heapify(heap)
    assert heap[0] is older and older.name == "b-0@0"
    assert tie_breaker(older, newer) == "older"
    assert tie_breaker(older, older._replace(topic="c")) == "name"


# -- the whole way ------------------------------------------------------------------------

BASE_TS = 1_700_000_000_000


def _over(tmpfs: Callable[[int], Path], tmp_path: Path) -> tuple[Path, Path]:
    mount = tmpfs(32 * MiB)
    log_dir = mount / "kafka-logs"
    old = SegmentSpec(records=20, payload_size=5_000, first_timestamp_ms=BASE_TS)
    new = dataclasses.replace(old, first_timestamp_ms=BASE_TS + 3_600_000)
    write_log_dir(log_dir, {("orders", 0): [old, new, new], ("clicks", 1): [new, old, old]})
    fill(mount / "filler", 20 * MiB)
    cfg = write_config(tmp_path, log_dir, disk_usage_percent=10, mode="offline")
    return cfg, log_dir


def test_the_why_reaches_plan_the_audit_log_audit_and_the_events(
    tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    cfg, _log_dir = _over(tmpfs, tmp_path)
    plan, _err = plan_json(cfg)
    first = plan["deletions"][0]
    assert list(first["why"]) == list(Why._fields)
    assert (first["topic"], first["partition"], first["base_offset"]) == ("orders", 0, 0)
    assert first["why"]["rank"] == 1 and first["why"]["trigger"] == "usage"
    assert first["why"]["limit_percent"] == 10.0 and first["why"]["tie_breaker"] == "older"
    text = run_cli("plan", "-c", str(cfg), env={"COLUMNS": "300"}).stdout
    assert f"#1, before {first['why']['before']} (older)" in text, text

    enforced = run_cli("enforce", "--once", "--json", "-c", str(cfg))
    assert enforced.returncode in (0, 1), enforced.stderr
    deleted = [e for e in json_events(enforced.stdout) if e["event"] == "segment_deleted"]
    assert deleted and deleted[0]["why"] == first["why"]
    lines = [
        json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()
    ]
    intent = next(x for x in lines if x["phase"] == "intent" and x["base_offset"] == 0)
    assert intent["why"] == first["why"]
    # The line only gained the field: everything it had is still there.
    assert {"rule", "reason", "usage_before_percent", "unconsumed_records", "scope"} <= set(intent)

    table = run_cli("audit", "-c", str(cfg), env={"COLUMNS": "300"}).stdout
    assert f"#1, before {first['why']['before']} (older)" in table, table
    explained = run_cli("audit", "-c", str(cfg), "--explain", "orders-0@0")
    assert explained.returncode == 0, explained.stderr
    (sentence,) = explained.stdout.splitlines()
    assert sentence.startswith("orders-0@0 (")
    assert "was at " in sentence and "(measured), over its 10 % limit" in sentence
    assert f"It was #1 in the global order, oldest first, ahead of {first['why']['before']}" in (
        sentence
    )
    assert "because its newest record is older" in sentence
    assert sentence.endswith("Outcome: deleted, freed " + sentence.rsplit("freed ", 1)[1])


def test_explain_a_malformed_argument_is_exit_2_and_an_unknown_segment_exit_1(
    tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    cfg, _log_dir = _over(tmpfs, tmp_path)
    bad = run_cli("audit", "-c", str(cfg), "--explain", "orders@0")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "diskguard: --explain: not topic-partition@offset: 'orders@0' (e.g. orders-3@120400, "
        "the segment's base offset)"
    ]
    missing = run_cli("audit", "-c", str(cfg), "--explain", "orders-0@7")
    assert missing.returncode == 1
    assert missing.stderr.splitlines() == [
        f"diskguard: no deletion of orders-0@7 in {tmp_path / 'state' / 'audit.jsonl'}"
    ]
    # A topic name with dashes and dots is split at its last dash.
    run_cli("enforce", "--once", "-c", str(cfg))
    found = run_cli("audit", "-c", str(cfg), "--explain", "clicks-1@0")
    assert found.returncode == 0 and found.stdout.startswith("clicks-1@0 ("), found.stderr


def test_explain_says_what_an_older_line_has(tmp_path: Path) -> None:
    """A line written before the audit line carried a why: the rule and the usage."""
    (tmp_path / "logs").mkdir()
    cfg = write_config(tmp_path, tmp_path / "logs")
    state = tmp_path / "state"
    state.mkdir()
    old = {
        "ts": "2026-01-02T03:04:05.000+00:00",
        "action_id": "a1",
        "phase": "intent",
        "mount": "/data",
        "log_dir": "/data/kafka",
        "topic": "my.topic-x",
        "partition": 2,
        "base_offset": 40,
        "next_offset": 80,
        "bytes": 2048,
        "max_timestamp_ms": BASE_TS,
        "rule": "disk_usage_percent",
        "mode": "offline",
        "reason": "filesystem over retention.disk_usage_percent",
        "usage_before_percent": 91.5,
        "unconsumed_records": {},
    }
    done = {**old, "phase": "done", "freed_bytes": 4096, "error": None}
    (state / "audit.jsonl").write_text(json.dumps(old) + "\n" + json.dumps(done) + "\n")
    out = run_cli("audit", "-c", str(cfg), "--explain", "my.topic-x-2@40")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "my.topic-x-2@40 (2.0 KiB, newest record 2023-11-14 22:13:20 UTC) was "
        "chosen at 2026-01-02 03:04:05 UTC, mode offline: rule disk_usage_percent, /data at "
        "91.5 % (no more recorded: the line predates the audit log's why). Outcome: deleted, "
        "freed 4.0 KiB."
    )
