"""The matrix table (``make test-kafka-matrix``) from the JUnit reports its entries leave: what
passed, failed or was skipped on each release, with the reason, and entries run one at a time
put together into one table."""

from __future__ import annotations

from pathlib import Path

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
        '<skipped message="Kafka 2.8.2 has no ConsumerGroupHeartbeat (KIP-848)" /></testcase>'
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
        "| `test_realkafka::test_kip848` | skip: Kafka 2.8.2 has no ConsumerGroupHeartbeat "
        "(KIP-848) | **failed**: AssertionError: no group \\| listed |"
    ) in text
    assert "| **total** | 1 passed, 0 failed, 1 skipped (1.5 min) |" in text


def test_an_entry_without_a_report_is_said_not_guessed(tmp_path: Path) -> None:
    code = matrix.main(["--from-reports", "--reports", str(tmp_path), "--only", "3.9.2:zk"])
    assert code == 2
