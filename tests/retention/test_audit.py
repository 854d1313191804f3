"""The audit log: line format, torn lines, ENOSPC on a real full tmpfs (with and without the
reserve), and the ``diskguard audit`` command."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from diskguard.cli import cli
from diskguard.retention.audit import AuditLog, AuditWriteFailed, pair_actions, read_audit
from diskguard.retention.planner import Deletion
from support import configs

KiB = 1024


def deletion(**overrides: object) -> Deletion:
    fields: dict[str, object] = {
        "log_dir": "/data/kafka",
        "topic": "orders",
        "partition": 3,
        "base_offset": 1200,
        "next_offset": 1800,
        "max_timestamp_ms": 1_700_000_000_000,
        "bytes": 5 * 1024 * 1024,
        "files": ("/data/kafka/orders-3/00000000000000001200.log",),
        "mount": "/data",
        "unconsumed_records": {"billing": 17},
    }
    fields.update(overrides)
    return Deletion(**fields)  # type: ignore[arg-type]


def test_intent_and_outcome_lines_carry_every_field(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    action = audit.before(deletion(), "filesystem over limit", 93.25, "offline")
    audit.after(action, True, 4096, None)
    intent, done = list(read_audit(tmp_path / "audit.jsonl"))
    assert intent["action_id"] == done["action_id"] == action
    assert (intent["phase"], done["phase"]) == ("intent", "done")
    for line in (intent, done):
        assert line["mode"] == "offline"
        assert line["mount"] == "/data" and line["log_dir"] == "/data/kafka"
        assert (line["topic"], line["partition"]) == ("orders", 3)
        assert (line["base_offset"], line["next_offset"]) == (1200, 1800)
        assert line["bytes"] == 5 * 1024 * 1024
        assert line["max_timestamp_ms"] == 1_700_000_000_000
        assert line["reason"] == "filesystem over limit"
        assert line["usage_before_percent"] == 93.25
        assert line["unconsumed_records"] == {"billing": 17}
        assert line["ts"].endswith("+00:00")
    assert done["freed_bytes"] == 4096 and done["error"] is None


def test_failed_and_refused_lines(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    action = audit.before(deletion(), "why", 90.0, "broker")
    audit.after(action, False, 0, "NOT_LEADER_FOR_PARTITION")
    audit.refused(deletion(partition=4), "why", 90.0, "offline", "lock held")
    lines = list(read_audit(tmp_path / "audit.jsonl"))
    assert [line["phase"] for line in lines] == ["intent", "failed", "refused"]
    assert lines[1]["error"] == "NOT_LEADER_FOR_PARTITION"
    assert lines[2]["partition"] == 4 and lines[2]["error"] == "lock held"
    actions = pair_actions(lines)
    assert len(actions) == 2 and actions[1].intent is None


def test_a_torn_last_line_is_skipped_and_does_not_swallow_the_next(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    first = audit.before(deletion(), "why", 90.0, "offline")
    with open(path, "ab") as fh:
        fh.write(b'{"ts": "2024-01-01T00:00:00+00:00", "action_id": "x", "pha')
    assert [line["action_id"] for line in read_audit(path)] == [first]
    audit.after(first, True, 1, None)
    assert [line["phase"] for line in read_audit(path)] == ["intent", "done"]


def _fill(mount: Path) -> None:
    """Fill ``mount`` to the last page (tmpfs: no reserved blocks, no delayed allocation)."""
    i = 0
    while True:
        try:
            with open(mount / f"fill{i}", "wb") as fh:
                fh.write(b"\xa5" * 4096)
        except OSError:
            return
        i += 1


def test_enospc_uses_the_reserve(tmpfs: Callable[[int], Path]) -> None:
    mnt = tmpfs(4096 * KiB)
    audit = AuditLog(mnt / "audit.jsonl", reserve_bytes=256 * KiB)
    assert audit.ensure_reserve()
    _fill(mnt)
    with pytest.raises(OSError):
        (mnt / "probe").write_bytes(b"x" * 4096)
    for _ in range(20):
        action = audit.before(deletion(), "why", 100.0, "offline")
        audit.after(action, True, 0, None)
    assert len(list(read_audit(mnt / "audit.jsonl"))) == 40
    assert os.stat(audit.reserve_path).st_size < 256 * KiB


def test_enospc_without_reserve_refuses_and_leaves_no_torn_line(
    tmpfs: Callable[[int], Path],
) -> None:
    mnt = tmpfs(256 * KiB)
    path = mnt / "audit.jsonl"
    # One complete line that ends 100 bytes short of a page: the next line's first 100 bytes
    # fit, the rest needs a page the full filesystem does not have (a short write).
    pad = 4096 - 100 - len('{"pad": ""}\n')
    path.write_text(json.dumps({"pad": "p" * pad}) + "\n")
    assert path.stat().st_size == 4096 - 100
    audit = AuditLog(path, reserve_bytes=0)
    _fill(mnt)
    with pytest.raises(AuditWriteFailed, match="No space left on device"):
        audit.before(deletion(), "why", 100.0, "offline")
    assert path.stat().st_size == 4096 - 100
    assert list(read_audit(path)) == [{"pad": "p" * pad}]


# ----------------------------------------------------------------------------- the command


def write_config(tmp_path: Path) -> Path:
    (tmp_path / "logs").mkdir(exist_ok=True)
    return configs.write_config(tmp_path, tmp_path / "logs", assume_delete_policy=None)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["audit", *args], env={"COLUMNS": "300"})
    return result.exit_code, result.output


def test_audit_command_without_a_log(tmp_path: Path) -> None:
    code, out = run("-c", str(write_config(tmp_path)))
    assert code == 0
    assert "no deletions recorded yet" in out


def test_audit_command_pairs_intents_with_outcomes(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    audit = AuditLog(tmp_path / "state" / "audit.jsonl")
    a = audit.before(deletion(), "disk over limit", 95.0, "offline")
    audit.after(a, True, 3 * 1024 * 1024, None)
    b = audit.before(deletion(partition=4, unconsumed_records={}), "over limit", 95.0, "broker")
    audit.after(b, False, 0, "NOT_LEADER_FOR_PARTITION: not leader")
    audit.refused(deletion(partition=5), "disk over limit", 95.0, "offline", "lock held by pid 7")
    audit.before(deletion(partition=6), "disk over limit", 95.0, "offline")  # crashed here

    code, out = run("-c", str(cfg))
    assert code == 0, out
    for text in (
        "orders-3",
        "orders-4",
        "orders-5",
        "orders-6",
        "deleted, freed 3.0 MiB",
        "failed: NOT_LEADER_FOR_PARTITION",
        "refused: lock held",
        "no outcome recorded",
        "billing: 17",
        "5.0 MiB",
        "1200",
    ):
        assert text in " ".join(out.split()), (text, out)

    code, out = run("-c", str(cfg), "--json")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    phases = [line["phase"] for line in lines]
    assert phases == ["intent", "done", "intent", "failed", "refused", "intent"]

    code, out = run("-c", str(cfg), "--json", "--limit", "2")
    assert [json.loads(line)["partition"] for line in out.splitlines()] == [5, 6]

    code, out = run("-c", str(cfg), "--since", "2999-01-01")
    assert code == 0 and "no deletions recorded in that range" in out
    code, out = run("-c", str(cfg), "--json", "--since", "2000-01-01T00:00:00Z")
    assert len(out.splitlines()) == 6


def test_audit_command_bad_since_is_usage_error(tmp_path: Path) -> None:
    code, out = run("-c", str(write_config(tmp_path)), "--since", "yesterday")
    assert code == 2
    assert "--since" in out and "yesterday" in out
