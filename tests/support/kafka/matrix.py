"""``make test-kafka-matrix``: the realkafka tests against every supported Kafka line, and the
table of what passed where (``docs/kafka-matrix.md``, which the README links).

Each entry runs ``pytest -m realkafka`` in its own process with ``DISKGUARD_KAFKA_VERSION`` and
``DISKGUARD_KAFKA_MODE`` set, a JUnit XML report per entry; a test skipped on a release says
why in the table (an API the release does not have), never silently.
"""

from __future__ import annotations

import argparse
import os
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


def saved_entry(release: str, mode: str, workdir: Path) -> tuple[dict[str, Outcome], float, str]:
    """An entry's results from the report an earlier run left: its outcomes, the time the
    suite took and the day it ran (the report's own timestamp)."""
    suite = ET.parse(_report(workdir, release, mode)).getroot().find("testsuite")
    elapsed = float(suite.get("time", "0")) if suite is not None else 0.0
    day = (suite.get("timestamp", "") if suite is not None else "")[:10]
    return _outcomes(_report(workdir, release, mode)), elapsed, day


def run_entry(
    release: str, mode: str, workdir: Path, extra: list[str]
) -> tuple[dict[str, Outcome], float, int]:
    report = _report(workdir, release, mode)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m support.kafka matrix")
    ap.add_argument("--output", type=Path, help="write the markdown table here")
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
        "--reports", type=Path, default=REPO / "build" / "kafka-matrix", help="JUnit XML dir"
    )
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args(argv)
    workdir = args.reports
    workdir.mkdir(parents=True, exist_ok=True)
    wanted = [e for e in ENTRIES if not args.only or f"{e[0]}:{e[1]}" in args.only]
    columns = []
    days = set()
    failed = False
    for release, mode in wanted:
        if args.from_reports:
            if not _report(workdir, release, mode).exists():
                print(f"no report for Kafka {release} ({mode}): run it first", file=sys.stderr)
                return 2
            results, elapsed, day = saved_entry(release, mode, workdir)
            failed |= any(o.status == "failed" for o in results.values())
            days.add(day)
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
        "the API the release lacks.\n\n" + text
    )
    if args.output:
        args.output.write_text(document)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
