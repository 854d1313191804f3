"""The matrix table (``make test-kafka-matrix``) from the JUnit reports its entries leave: what
passed, failed or was skipped on each release, with the reason, and entries run one at a time
put together into one table."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.kafka import matrix


def report(path: Path, stamp: str, cases: str) -> None:
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
        f'time="90.0" timestamp="{stamp}T10:00:00+00:00">{cases}</testsuite></testsuites>'
    )


def test_the_table_from_reports_of_entries_run_one_at_a_time(tmp_path: Path) -> None:
    case = '<testcase classname="tests.broker.test_realkafka" name="test_{}" time="1" />'
    skipped = (
        '<testcase classname="tests.broker.test_realkafka" name="test_kip848" time="0">'
        '<skipped message="Kafka 2.8.2 (ZooKeeper): no ConsumerGroupHeartbeat (KIP-848); '
        'a later line" /></testcase>'
    )
    failed = (
        '<testcase classname="tests.broker.test_realkafka" name="test_kip848" time="3">'
        '<failure message="AssertionError: no group | listed" /></testcase>'
    )
    for release, mode, stamp, extra in (
        ("kafka_2.12:2.8.2", "zk", "2026-11-26", skipped),
        ("4.4.0", "kraft", "2026-11-27", failed),
    ):
        report(matrix._report(tmp_path, release, mode), stamp, case.format("a") + extra)
    out = tmp_path / "matrix.md"
    only = ["--only", "kafka_2.12:2.8.2:zk", "--only", "4.4.0:kraft"]
    code = matrix.main(["--from-reports", "--reports", str(tmp_path), "--output", str(out), *only])
    text = out.read_text()
    assert code == 1  # a failure anywhere fails the matrix
    assert "on 2026-11-26 to 2026-11-27" in text
    assert "| test | 2.8.2 ZooKeeper | 4.4.0 KRaft |" in text
    assert "| `test_realkafka::test_a` | pass | pass |" in text
    assert (
        "| `test_realkafka::test_kip848` | skip: Kafka 2.8.2 (ZooKeeper): no "
        "ConsumerGroupHeartbeat (KIP-848); a later line | **failed**: AssertionError: no group "
        "\\| listed |"
    ) in text
    assert "| **total** | 1 passed, 0 failed, 1 skipped (1.5 min) |" in text


def test_a_rerun_of_some_tests_replaces_their_results_and_is_said(tmp_path: Path) -> None:
    """``--rerun`` keeps a partial run beside the entry's full one: the table shows each
    test's newest result, keeps the others', and says what was re-run when."""
    case = '<testcase classname="tests.broker.test_realcluster" name="test_{}" time="1" />'
    failed = (
        '<testcase classname="tests.broker.test_realcluster" name="test_b" time="3">'
        '<failure message="AssertionError: no acl_applied" /></testcase>'
    )
    full = matrix._report(tmp_path, "3.9.2", "kraft")
    report(full, "2026-11-26", case.format("a") + failed)
    again = full.with_name(f"{full.stem}.rerun-20261127T174000.xml")
    report(again, "2026-11-27", case.format("b") + case.format("c"))
    out = tmp_path / "matrix.md"
    only = ["--only", "3.9.2:kraft"]
    code = matrix.main(["--from-reports", "--reports", str(tmp_path), "--output", str(out), *only])
    text = out.read_text()
    assert code == 0  # the failure was re-run and passed
    assert "| `test_realcluster::test_a` | pass |" in text
    assert "| `test_realcluster::test_b` | pass |" in text
    assert "| `test_realcluster::test_c` | pass |" in text
    assert "Written by `make test-kafka-matrix` on 2026-11-26 " in text
    assert "3.9.2 KRaft on 2026-11-27 10:00 UTC (2 tests, 1.5 min)" in text
    assert "| **total** | 3 passed, 0 failed, 0 skipped (1.5 min) |" in text


def test_rerun_runs_the_tests_named_and_keeps_the_full_runs_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--rerun`` end to end (a stand-in test for a broker's): pytest runs the module named,
    its report lands beside the entry's full one (a relative ``--reports`` taken from where
    the command runs), and the document shows both."""
    case = '<testcase classname="tests.broker.test_realkafka" name="test_{}" time="1" />'
    reports = tmp_path / "reports"
    reports.mkdir()
    report(matrix._report(reports, "4.4.0", "kraft"), "2026-11-26", case.format("a"))
    module = tmp_path / "test_again.py"
    module.write_text(
        "import pytest\n\npytestmark = pytest.mark.realkafka\n\n\ndef test_b():\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "matrix.md"
    only = ["--only", "4.4.0:kraft"]
    args = ["--rerun", "--reports", "reports", "--output", str(out), *only, "--", str(module)]
    assert matrix.main(args) == 0
    assert len(list(reports.glob("4.4.0-kraft.rerun-*.xml"))) == 1
    text = out.read_text()
    assert "| `test_realkafka::test_a` | pass |" in text
    assert "| `test_again::test_b` | pass |" in text
    assert "4.4.0 KRaft on " in text and "(1 test, " in text


def test_the_per_call_table_goes_between_its_markers(tmp_path: Path) -> None:
    kip848 = "test_realkafka::test_committed_offsets_of_a_kip848_consumer_group"
    skipped = matrix.Outcome("skipped", "Kafka 2.8.2 (ZooKeeper): no ConsumerGroupHeartbeat; later")
    columns = [
        ("kafka_2.12:2.8.2", "zk", {kip848: skipped}, 60.0),
        ("4.4.0", "kraft", {kip848: matrix.Outcome("passed")}, 60.0),
    ]
    doc = tmp_path / "calls.md"
    doc.write_text(f"# head\n{matrix.CALLS_BEGIN}\nold\n{matrix.CALLS_END}\n# tail\n")
    matrix.put_calls_table(doc, matrix.calls_table(columns), "2026-11-27")
    text = doc.read_text()
    assert text.startswith("# head\n") and text.endswith("# tail\n") and "\nold\n" not in text
    assert "| broker call | diskguard | 2.8.2 ZooKeeper | 4.4.0 KRaft |" in text
    row = next(line for line in text.splitlines() if "KIP-848 consumer group" in line)
    assert row.endswith("| skip 1: no ConsumerGroupHeartbeat | ✔ 1 |"), row
    assert "| DeleteRecords on a compacted topic: `POLICY_VIOLATION` |" in text  # not run: said
    assert "not run | not run |" in text


def test_an_entry_without_a_report_is_said_not_guessed(tmp_path: Path) -> None:
    code = matrix.main(["--from-reports", "--reports", str(tmp_path), "--only", "3.9.2:zk"])
    assert code == 2


def test_every_realkafka_test_is_in_a_row_of_the_per_call_table() -> None:
    """The per-call table names tests by module and name: a renamed or new realkafka test
    must land in a row (the harness's own tests verify no call of diskguard's)."""
    tests = Path(__file__).resolve().parents[1]
    defined = set()
    for module in tests.rglob("test_*.py"):
        text = module.read_text()
        marked = any(
            line.startswith("pytestmark") and "pytest.mark.realkafka" in line
            for line in text.splitlines()
        )
        if marked and module.stem != "test_kafka_harness":
            defined |= {
                f"{module.stem}::{line[4:].split('(')[0]}"
                for line in text.splitlines()
                if line.startswith("def test_")
            }
    rows = {name for _call, _code, names in matrix.CALLS for name in names}
    assert rows - defined == set()  # no row names a test that is gone
    assert defined - rows == set()
