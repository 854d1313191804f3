"""``make test-kafka-matrix``: the realkafka tests against every supported Kafka line, and the
table of what passed where (``docs/kafka-matrix.md``, which the README links).

Each entry runs ``pytest -m realkafka`` in its own process with ``DISKGUARD_KAFKA_VERSION`` and
``DISKGUARD_KAFKA_MODE`` set, a JUnit XML report per entry; a test skipped on a release says
why in the table (an API the release does not have), never silently.

A whole matrix takes hours on two cores; ``--rerun`` runs only some tests (the pytest
arguments, e.g. one module) on the chosen entries and keeps their report beside the entry's
full one: the table takes each test's newest result and says which were re-run, and when.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

#: (release, mode) in the table's column order: oldest first.
ENTRIES: tuple[tuple[str, str], ...] = (
    ("kafka_2.12:2.8.2", "zk"),
    ("3.9.2", "zk"),
    ("3.9.2", "kraft"),
    ("4.0.2", "kraft"),
    ("4.4.0", "kraft"),
)


@dataclass(frozen=True)
class Outcome:
    status: str  # passed, failed, skipped
    detail: str = ""


def _outcomes(report: Path) -> dict[str, Outcome]:
    results: dict[str, Outcome] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            results[name] = Outcome("failed", (failure.get("message") or "")[:200])
        elif skipped is not None:
            results[name] = Outcome("skipped", (skipped.get("message") or "")[:200])
        else:
            results[name] = Outcome("passed")
    return results


def _report(workdir: Path, release: str, mode: str) -> Path:
    return workdir / f"{release.replace(':', '-')}-{mode}.xml"


def _reruns(workdir: Path, release: str, mode: str) -> list[Path]:
    """The entry's partial re-runs (``--rerun``), oldest first (their names sort by time)."""
    return sorted(workdir.glob(f"{_report(workdir, release, mode).stem}.rerun-*.xml"))


def _suite(report: Path) -> tuple[float, str]:
    """The time a report's suite took and when it ran (its own timestamp, to the minute)."""
    suite = ET.parse(report).getroot().find("testsuite")
    if suite is None:
        return 0.0, ""
    return float(suite.get("time", "0")), suite.get("timestamp", "")[:16].replace("T", " ")


@dataclass(frozen=True)
class Rerun:
    """Tests of an entry run again after its full run: how many, when, how long."""

    tests: int
    when: str
    elapsed: float


def saved_entry(
    release: str, mode: str, workdir: Path
) -> tuple[dict[str, Outcome], float, str, list[Rerun]]:
    """An entry's results from the reports earlier runs left: each test's newest outcome
    (the full run's, or a later ``--rerun``'s), the time the full run took, the day it ran
    (the report's own timestamp) and the re-runs since."""
    results: dict[str, Outcome] = {}
    elapsed, day = 0.0, ""
    full = _report(workdir, release, mode)
    if full.exists():
        results = _outcomes(full)
        elapsed, stamp = _suite(full)
        day = stamp[:10]
    reruns = []
    for report in _reruns(workdir, release, mode):
        again = _outcomes(report)
        results.update(again)
        took, when = _suite(report)
        reruns.append(Rerun(len(again), when, took))
    return results, elapsed, day or (reruns[0].when[:10] if reruns else ""), reruns


def run_entry(
    release: str, mode: str, workdir: Path, extra: list[str], rerun: bool = False
) -> tuple[dict[str, Outcome], float, int]:
    report = _report(workdir, release, mode)
    if rerun:
        report = report.with_name(
            f"{report.stem}.rerun-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.xml"
        )
    env = {**os.environ, "DISKGUARD_KAFKA_VERSION": release, "DISKGUARD_KAFKA_MODE": mode}
    env.pop("DISKGUARD_KAFKA_HOME", None)
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "realkafka",
            f"--junitxml={report}",
            *extra,
        ],
        cwd=REPO,
        env=env,
    )
    elapsed = time.monotonic() - started
    return (_outcomes(report) if report.exists() else {}), elapsed, proc.returncode


def _cell(outcome: Outcome | None) -> str:
    if outcome is None:
        return "—"
    if outcome.status == "passed":
        return "pass"
    text = outcome.detail.replace("|", "\\|").replace("\n", " ")
    return f"**{outcome.status}**: {text}" if outcome.status == "failed" else f"skip: {text}"


def table(columns: list[tuple[str, str, dict[str, Outcome], float]]) -> str:
    names = sorted({n for *_, results, _t in columns for n in results})
    header = (
        "| test | "
        + " | ".join(
            f"{release.split(':')[-1]} {'KRaft' if mode == 'kraft' else 'ZooKeeper'}"
            for release, mode, _r, _t in columns
        )
        + " |"
    )
    lines = [header, "|---|" + "---|" * len(columns)]
    for name in names:
        cells = [_cell(results.get(name)) for _rel, _mode, results, _t in columns]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    totals = []
    for _rel, _mode, results, elapsed in columns:
        count = {
            s: sum(o.status == s for o in results.values()) for s in ("passed", "failed", "skipped")
        }
        totals.append(
            f"{count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped "
            f"({elapsed / 60:.1f} min)"
        )
    lines.append("| **total** | " + " | ".join(totals) + " |")
    return "\n".join(lines) + "\n"


#: Every broker call diskguard makes (and the offline rescue, which makes none), the code that
#: makes it and the tests that verify it: the per-call table of docs/broker-calls.md.
CALLS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Metadata: DescribeCluster (reachability), DescribeTopics (leaders)",
        "`BrokerClient.reachable`, `.leaders`",
        (
            "test_realkafka::test_reachable_is_a_metadata_round_trip",
            "test_realkafka::test_auto_mode_refused_then_the_broker_reachable_again_acts_at_once",
        ),
    ),
    (
        "DeleteRecords: the log start at once, the files at the retention check",
        "`BrokerClient.delete_records`, `plan`/`enforce --once` in broker mode",
        (
            "test_realkafka::test_delete_records_moves_the_log_start_and_the_files_go",
            "test_realkafka::test_plan_and_enforce_in_broker_mode",
            "test_realkafka::test_plan_in_broker_mode_on_two_cores_says_what_one_core_says",
            "test_realkafka_retention_timing::"
            "test_delete_records_frees_at_the_first_retention_check_after_start",
        ),
    ),
    (
        "DeleteRecords on a compacted topic: `POLICY_VIOLATION`",
        "`BrokerClient.delete_records`",
        ("test_realkafka::test_delete_records_on_a_compacted_topic_is_a_failed_result",),
    ),
    (
        "DeleteRecords denied by an ACL: set aside",
        "the set-aside (`retention/setaside.py`)",
        (
            "test_realkafka::test_a_topic_whose_deletes_an_acl_denies_is_set_aside",
            "test_realkafka::test_enforce_once_sets_a_denied_topic_aside_whole_and_trims_another",
        ),
    ),
    (
        "one cycle's requests (per broker, never per partition)",
        "`enforce --once` in broker mode",
        ("test_realkafka::test_a_broker_mode_cycle_asks_per_broker_not_per_partition",),
    ),
    (
        "the reclaim forecast beside real retention checks",
        "`diskguard run` in broker mode",
        ("test_broker_forecast_realkafka::test_one_off_writes_under_the_ceiling_delete_nothing",),
    ),
    (
        "DescribeConfigs (TOPIC)",
        "`topicconfigs.topics_from_broker`, `reserve`",
        ("test_realkafka::test_describe_configs_of_topics_and_the_reserve_report",),
    ),
    (
        "DescribeConfigs (BROKER), `check-config --connect`",
        "`BrokerClient.broker_configs`",
        (
            "test_realkafka::test_describe_configs_of_the_broker",
            "test_realkafka::test_check_config_connect_learns_the_reclaim_latency_and_the_authorizer",
        ),
    ),
    (
        "ListGroups + OffsetFetch, classic group",
        "`BrokerClient.committed_offsets`",
        ("test_realkafka::test_committed_offsets_of_a_subscribing_group",),
    ),
    (
        "ListGroups + OffsetFetch, KIP-848 consumer group",
        "`BrokerClient.committed_offsets`",
        ("test_realkafka::test_committed_offsets_of_a_kip848_consumer_group",),
    ),
    (
        "Produce (snapshots)",
        "`snapshots/kafkasink.py`",
        ("test_realkafka::test_kafka_sink_ships_the_spool_to_a_topic",),
    ),
    (
        "Fetch (the Spark Kafka source)",
        "`aggregate --input kafka://`",
        ("test_realcluster::test_the_fleet_report_says_which_broker_filled_first",),
    ),
    (
        "CreateAcls / DescribeAcls / DeleteAcls",
        "`acl` actuator",
        ("test_realkafka::test_flow_control_acl_blocks_real_producers_and_survives_kill_9",),
    ),
    (
        "DescribeClientQuotas / AlterClientQuotas",
        "`quota` actuator",
        ("test_realkafka::test_quota_actuator_throttles_a_real_producer",),
    ),
    (
        "every call as `User:diskguard` with only its documented ACLs (SASL/PLAIN)",
        "all of the above",
        (
            "test_realkafka_secured::"
            "test_diskguard_with_only_its_documented_acls_on_a_secured_broker",
        ),
    ),
    (
        "a three-broker cluster: shared holds (CreateTopics, Produce/Fetch of the holds "
        "topic, ACLs, quotas), one broker's trims pending on the others",
        "`flow/sharedholds.py`, `flow/holdsregistry.py`",
        (
            "test_realcluster::test_one_brokers_trims_are_pending_reclaim_on_the_others",
            "test_realcluster::test_a_hold_stops_producers_only",
            "test_realcluster::test_a_hold_lasts_while_any_guard_needs_it",
            "test_realcluster::test_a_guard_killed_while_holding_stops_counting_at_its_lease",
            "test_realcluster::test_check_config_says_what_the_hold_will_do_and_what_diskguard_may",
        ),
    ),
    (
        "ListOffsets (`LATEST_TIERED`), IncrementalAlterConfigs (TOPIC): tiered storage",
        "the ladder, rung 1 (`broker/ladderapi.py`)",
        (
            "test_realkafka_tiered::test_evicting_what_is_uploaded_frees_the_disk_and_loses_no_record",
            "test_realkafka_tiered::test_a_tiered_topic_is_never_deleted_unless_listed",
            "test_realkafka_tiered::test_a_stalled_upload_is_an_alert",
        ),
    ),
    (
        "DescribeLogDirs, AlterReplicaLogDirs, IncrementalAlterConfigs (BROKER "
        "`cordoned.log.dirs`): JBOD",
        "the ladder, rungs 2-5",
        (
            "test_realkafka_jbod::test_a_full_dirs_replica_moves_whole_to_the_roomy_one",
            "test_realkafka_jbod::test_the_filling_dir_is_cordoned_and_an_operators_cordon_is_kept",
            "test_realkafka_jbod::test_the_metadata_log_is_said_never_planned_and_watched",
            "test_realkafka_jbod::"
            "test_a_dir_that_failed_alone_is_left_alone_and_the_other_stays_guarded",
        ),
    ),
    (
        "none: the broker died of a full disk, the offline rescue",
        "`enforce --once`, auto mode",
        (
            "test_realkafka_rescue::test_rescue_after_the_broker_died_of_a_full_disk",
            "test_realkafka_rescue::test_rescue_keeps_the_compacted_topic",
            "test_realkafka_rescue::test_a_kraft_broker_rescued_with_no_cache_from_earlier_runs",
            "test_realkafka_rescue::"
            "test_the_kraft_rescue_never_touches_metadata_checkpoints_or_internal_topics",
            "test_realkafka_rescue::test_the_kraft_rescue_keeps_strays_and_says_so",
            "test_realkafka_rescue::"
            "test_without_server_properties_topics_with_no_override_stay_unknown",
            "test_realkafka_immutable::"
            "test_the_broker_starts_after_a_rescue_that_met_an_immutable_index",
        ),
    ),
)
CALLS_BEGIN = "<!-- make test-kafka-matrix: the per-call table, begin -->"
CALLS_END = "<!-- make test-kafka-matrix: the per-call table, end -->"


_TARGET = re.compile(r"^Kafka [\w.:]+ \((ZooKeeper|KRaft|zk|kraft)\)$")


def _short(reason: str) -> str:
    """A skip's reason up to its first colon or semicolon, past a leading "Kafka 3.9.2
    (ZooKeeper)": the API or mode the release lacks."""
    parts = [p.strip() for p in re.split(r"[:;] ", reason)]
    text = next((p for p in parts if not _TARGET.match(p)), parts[0])
    if text.count("(") > text.count(")"):
        text = text[: text.rfind("(")].strip()
    return text.replace("|", "\\|")


def _call_cell(results: dict[str, Outcome], tests: tuple[str, ...]) -> str:
    found = {t: results[t] for t in tests if t in results}
    if not found:
        return "not run"
    passed = [t for t, o in found.items() if o.status == "passed"]
    failed = [t for t, o in found.items() if o.status == "failed"]
    skipped = [o.detail for o in found.values() if o.status == "skipped"]
    parts = [f"✔ {len(passed)}"] if passed else []
    parts += [f"✘ `{t.split('::')[1]}`" for t in failed]
    if skipped:
        parts.append(f"skip {len(skipped)}: {_short(skipped[0])}")
    return "; ".join(parts)


def calls_table(columns: list[tuple[str, str, dict[str, Outcome], float]]) -> str:
    """One row per broker call: per release how many of its tests passed (✔ n), which failed
    (✘ name) and what was skipped and why."""
    heads = [
        f"{release.split(':')[-1]} {'KRaft' if mode == 'kraft' else 'ZooKeeper'}"
        for release, mode, _r, _t in columns
    ]
    lines = [
        "| broker call | diskguard | " + " | ".join(heads) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for call, code, tests in CALLS:
        cells = [_call_cell(results, tests) for _rel, _mode, results, _t in columns]
        lines.append(f"| {call} | {code} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def put_calls_table(document: Path, text: str, when: str) -> None:
    """Replace the per-call table between its markers in ``document``."""
    current = document.read_text()
    if CALLS_BEGIN not in current or CALLS_END not in current:
        raise SystemExit(f"{document}: no per-call table markers ({CALLS_BEGIN})")
    head, rest = current.split(CALLS_BEGIN, 1)
    tail = rest.split(CALLS_END, 1)[1]
    block = f"{CALLS_BEGIN}\n\nFrom `make test-kafka-matrix` on {when}.\n\n{text}\n{CALLS_END}"
    document.write_text(head + block + tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m support.kafka matrix")
    ap.add_argument("--output", type=Path, help="write the markdown table here")
    ap.add_argument("--calls", type=Path, help="put the per-call table in this document")
    ap.add_argument(
        "--only", action="append", default=[], help="RELEASE:MODE entries to run (default all)"
    )
    ap.add_argument(
        "--from-reports",
        action="store_true",
        help="run nothing: write the table from the reports earlier runs left in "
        "build/kafka-matrix (entries run one at a time, e.g. with --only)",
    )
    ap.add_argument(
        "--rerun",
        action="store_true",
        help="run only the tests the pytest arguments name on the entries (--only) and keep "
        "their results beside each entry's full run: the table (every entry with a report) "
        "shows each test's newest result and says what was re-run when",
    )
    ap.add_argument(
        "--reports", type=Path, default=REPO / "build" / "kafka-matrix", help="JUnit XML dir"
    )
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args(argv)
    workdir = args.reports.resolve()  # pytest runs in the repository, not here
    workdir.mkdir(parents=True, exist_ok=True)
    wanted = [e for e in ENTRIES if not args.only or f"{e[0]}:{e[1]}" in args.only]
    columns = []
    days = set()
    reruns: list[tuple[str, str, list[Rerun]]] = []
    failed = False
    if args.rerun:
        for release, mode in wanted:
            print(f"== Kafka {release} ({mode}): {' '.join(args.pytest_args)}", flush=True)
            _results, _elapsed, code = run_entry(
                release, mode, workdir, args.pytest_args, rerun=True
            )
            failed |= code != 0
        wanted = [
            (r, m) for r, m in ENTRIES if _report(workdir, r, m).exists() or _reruns(workdir, r, m)
        ]
    for release, mode in wanted:
        if args.from_reports or args.rerun:
            if not _report(workdir, release, mode).exists() and not _reruns(workdir, release, mode):
                print(f"no report for Kafka {release} ({mode}): run it first", file=sys.stderr)
                return 2
            results, elapsed, day, again = saved_entry(release, mode, workdir)
            failed |= any(o.status == "failed" for o in results.values())
            days.add(day)
            reruns.append((release, mode, again))
        else:
            print(f"== Kafka {release} ({mode})", flush=True)
            results, elapsed, code = run_entry(release, mode, workdir, args.pytest_args)
            failed |= code != 0
            days.add(time.strftime("%Y-%m-%d", time.gmtime()))
        columns.append((release, mode, results, elapsed))
    text = table(columns)
    when = min(days) if len(days) == 1 else f"{min(days)} to {max(days)}"
    document = (
        "# The realkafka tests on every supported Kafka line\n\n"
        f"Written by `make test-kafka-matrix` on {when} (brokers from Maven Central, run as "
        "nobody on loop ext4; KRaft = one combined broker+controller node). A skip names "
        "the API the release lacks; — = not in that entry's run (a test added since)."
        + _rerun_note(reruns)
        + "\n\n"
        + text
    )
    if args.output:
        args.output.write_text(document)
    if args.calls:
        put_calls_table(args.calls, calls_table(columns), when)
    print(text)
    return 1 if failed else 0


def _rerun_note(reruns: list[tuple[str, str, list[Rerun]]]) -> str:
    """What was re-run after the full runs (``--rerun``), whose results the table shows."""
    said = [
        f"{release.split(':')[-1]} {'KRaft' if mode == 'kraft' else 'ZooKeeper'} on "
        f"{r.when} UTC ({r.tests} test{'' if r.tests == 1 else 's'}, {r.elapsed / 60:.1f} min)"
        for release, mode, again in reruns
        for r in again
    ]
    if not said:
        return ""
    return (
        " Tests re-run since the full runs (`--rerun`; the table shows each test's newest "
        "result, the totals' time is the full run's): " + "; ".join(said) + "."
    )


if __name__ == "__main__":
    sys.exit(main())
