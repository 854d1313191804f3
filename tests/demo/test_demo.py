"""``make demo`` end to end: a real Kafka 4.x broker on a loop ext4, real producers, the real
daemon in broker mode, flow control by a real ACL, the broker's death on a full disk and its
rescue by ``enforce --once``, the Spark job reading the snapshot topic.

The whole demo runs as it does for a user (a subprocess, ``PYTHONPATH=demo:tests``); the test
then checks that the story happened from what the product itself wrote (the daemon's and
``enforce``'s JSON events, the audit log, the report) and what the demo printed, never how
long anything took. Refusals (not root, no Java, a foreign dir) are one line and exit 2.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diskguard_demo import demo, narration

REPO = Path(demo.__file__).resolve().parents[2]
# The demo is not in the wheel and reaches the Kafka harness by name: what `make demo` sets.
DEMO_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO / "demo"), str(REPO / "tests"), os.environ.get("PYTHONPATH")])
    ),
}


def _run_demo(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diskguard_demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=DEMO_ENV,
    )


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def _named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == name]


@pytest.mark.realkafka
@pytest.mark.spark
def test_the_demo_tells_the_whole_story(tmp_path: Path) -> None:
    sandbox = tmp_path / "demo"
    proc = _run_demo("--dir", str(sandbox), timeout=1500)
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}"
    daemon = _events(sandbox / "daemon.log")
    rescue = _events(sandbox / "enforce.log")

    # 1. Broker mode: DeleteRecords, the first asked ahead of the ceiling by the forecast.
    (started,) = _named(daemon, "daemon_started")
    assert started["mode"] == "broker", started
    cycles = _named(daemon, "retention_cycle")
    assert cycles and {c["mode"] for c in cycles} == {"broker"}, cycles
    assert cycles[0]["usage_before"] < cycles[0]["limit_percent"], cycles[0]
    asked = _named(daemon, "segment_deleted")
    assert asked and {e["mode"] for e in asked} == {"broker"}
    assert _named(daemon, "delete_records")
    assert re.search(r"broker: deleted \d+ segments of \d+ partitions \(its retention", out), out

    # 2. Flow control: overfull -> the broker refuses the producers -> cleared -> writing again.
    names = [e["event"] for e in daemon]
    for name in ("overfull", "acl_applied", "overfull_cleared", "acl_removed"):
        assert name in names, name
    assert names.index("overfull") < names.index("acl_applied") < names.index("acl_removed")
    assert "TOPIC_AUTHORIZATION_FAILED): held back" in out, out
    assert out.index("held back") < out.index("writing again"), out

    # 3. and 4. The broker died of the full disk; enforce --once rescued it offline.
    assert "Shutdown broker because all log dirs in" in out, out
    offline = _named(rescue, "segment_deleted")
    assert offline and {e["mode"] for e in offline} == {"offline"}, rescue[-5:]
    assert re.search(r"enforce: exit 0, mode offline; disk [\d.]+% -> ", out), out
    assert "broker: serves again; accepts writes" in out, out
    audit = _events(sandbox / "state" / "audit.jsonl")
    assert {a.get("mode") for a in audit if a.get("phase") == "done"} >= {"broker", "offline"}

    # Never the compacted topic (the oldest data on the disk) nor an internal one: by the
    # product's events, and by the demo's own look at the files.
    for event in asked + offline:
        assert event["topic"] not in ("customers",) and not event["topic"].startswith("__")
    assert "__cluster_metadata: every segment still there" in out, out

    # 5. The snapshots went through the real topic into the Spark job.
    assert re.search(r"^\s+\d+\.\ds  spark: aggregated [1-9]\d* snapshots", out, re.M), out
    report = sandbox / "report" / "report.html"
    assert report.is_file() and report.stat().st_size > 0
    assert _named(daemon, "snapshot_shipped")


def test_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    proc = _run_demo("--dir", str(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "refusing to wipe it" in proc.stderr
    assert precious.read_text() == "keep me"


def test_without_root_it_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert demo.main(["--dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs root" in err and "sudo make demo" in err
    assert not (tmp_path / "out").exists()


def test_without_java_it_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "java" else real_which(name)
    )
    assert demo.main(["--dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "java not found" in err and "make tools" in err


def test_retention_cycles_are_told_in_one_line() -> None:
    t = narration.Tally()
    for base in (0, 1500):
        assert (
            narration.take(
                t,
                {
                    "event": "segment_deleted",
                    "topic": "payments",
                    "partition": 0,
                    "base_offset": base,
                    "bytes": 1 << 20,
                    "mode": "broker",
                },
            )
            is None
        )
    narration.take(
        t,
        {
            "event": "unconsumed_data_deleted",
            "topic": "payments",
            "partition": 0,
            "base_offset": 1500,
            "unconsumed_records": {"billing": 12},
        },
    )
    cycle = {"event": "retention_cycle", "mode": "broker", "usage_before": 45.3}
    assert narration.take(t, cycle | {"limit_percent": 60.0}) is None
    line = narration.batch_line(t)
    assert line == (
        "daemon: at 45.3%, under the 60% ceiling: the forecast says the disk would cross it"
        " before the broker's next retention check; DeleteRecords for 2 segments (2.0 MiB),"
        " globally oldest first: payments-0 x2; group billing had not read 12 of their records"
    )
    assert narration.batch_line(t) is None
    assert t.deleted.count == 2


def test_event_lines_for_a_person() -> None:
    t = narration.Tally()
    line = narration.take(
        t,
        {
            "event": "overfull",
            "level": "warning",
            "mount": "/mnt",
            "usage_percent": 75.2,
            "limit": "overfull_percent=75,min_free_bytes=5",
            "reason": "usage",
            "message": "store overfull, flow control will be enforced",
        },
    )
    assert line == (
        "daemon: OVERFULL at 75.2% (crossed overfull_percent and min_free_bytes):"
        " store overfull, flow control will be enforced"
    )
    assert t.overfull_now
    assert narration.take(t, {"event": "snapshot_shipped", "level": "info"}) is None
    warned = narration.take(t, {"event": "spool_unavailable", "level": "error", "error": "x"})
    assert warned is not None and warned.startswith("daemon error: spool_unavailable")
    console = io.StringIO()
    narration.Console(console).say("hello")
    assert re.fullmatch(r"\s+\d+\.\ds  hello\n", console.getvalue())
