"""The JSON the commands print about a plan: the ``plan --json`` contract and its encoder."""

from __future__ import annotations

import json
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from diskguard.kafkalog.model import usage_fields

orjson: ModuleType | None
try:
    import orjson
except ImportError:  # a development venv made before the dependency: the json module
    orjson = None

if TYPE_CHECKING:
    # Types only: status's --json uses dumps() without importing the planner (start-up).
    from diskguard.retention.ladder import LadderPlan
    from diskguard.retention.planner import FilesystemPlan, Plan


def plan_json(outcome_plan: Plan) -> dict[str, Any]:
    """The ``plan --json`` contract."""
    return {
        "filesystems": [
            {
                **usage_fields(fs.usage, fs.log_dirs),
                "usage_percent": fs.usage_percent,
                "limit_percent": fs.limit_percent,
                "target_percent": fs.target_percent,
                "pending_reclaim_bytes": fs.pending_reclaim_bytes,
                "excess_bytes": fs.excess_bytes,
                "chosen_bytes": fs.chosen_bytes,
                "unreachable_bytes": fs.unreachable_bytes,
                "trigger": _trigger(fs),
                "predicted_used_bytes": fs.predicted_used_bytes,
                "predicted_usage_percent": round(fs.predicted_usage_percent, 3),
                "growth_bytes_per_s": round(fs.growth_bytes_per_s, 1),
                "reclaim_latency_s": round(fs.reclaim_latency_s, 3),
                "reclaim_period_s": fs.reclaim_period_s,
                "latency_source": fs.latency_source,
                "forecast_horizon_s": fs.forecast_horizon_s,
                "halted": fs.halted or None,
            }
            for fs in outcome_plan.filesystems
        ],
        "deletions": [
            {
                "log_dir": d.log_dir,
                "topic": d.topic,
                "partition": d.partition,
                "base_offset": d.base_offset,
                "next_offset": d.next_offset,
                "max_timestamp_ms": d.max_timestamp_ms,
                "bytes": d.bytes,
                "files": list(d.files),
                "mount": d.mount,
                "reason": d.reason,
                "timestamp_source": d.timestamp_source,
                "unconsumed_records": dict(d.unconsumed_records),
                "groups_without_offset": list(d.groups_without_offset),
                "why": d.why.fields() if d.why is not None else None,
                "leader": d.leader,
                "replicas": list(d.replicas),
                "also_trims": list(d.also_trims),
            }
            for d in outcome_plan.deletions
        ],
        "protected": [{"topic": t.topic, "reason": t.reason} for t in outcome_plan.protected],
        "not_live": [
            {
                "path": d.path,
                "topic": d.topic,
                "partition": d.partition,
                "kind": d.kind.value,
                "bytes": d.bytes,
                "reason": d.reason,
            }
            for d in outcome_plan.not_live
        ],
    }


def _trigger(fs: FilesystemPlan) -> str | None:
    """Why this filesystem needs space: today's usage, the broker-mode forecast, or nothing."""
    if not fs.over_limit and not fs.chosen_count:
        return None
    return "predicted" if fs.predicted_trigger else "usage"


def dumps(value: Any, pretty: bool | None = None) -> str:
    """JSON for ``--json`` output: indented for a person at a terminal, compact otherwise.

    The contract is the JSON shape, not its whitespace. Indenting forces the json module's
    pure-Python encoder (0.5 s for a 10,000-deletion plan). Compact output goes through orjson:
    the json module's C encoder took ~75 ms for a 10,000-deletion plan (8.6 MB with each
    deletion's why), orjson ~10 ms, the same bytes. Where orjson's text would differ from the
    json module's (non-ASCII text, which json escapes; an integer past 64 bits or a string that
    is not valid UTF-8, which orjson refuses) the json module writes it as before. (A float
    that is not finite, which the json module wrote as the invalid `NaN`, is `null`.)
    ``pretty=None`` decides from whether stdout is a terminal.
    """
    return dumps_ascii(value, pretty).decode("ascii")


def dumps_ascii(value: Any, pretty: bool | None = None) -> bytes:
    """``dumps``' text as the ASCII bytes it is (the json module escapes the rest), for a
    command that writes it to stdout's bytes: a 10,000-deletion plan's 9 MB decoded, joined
    to a newline and encoded again by the text layer cost ~4x orjson's own time."""
    if pretty is None:
        pretty = sys.stdout.isatty()
    if pretty:
        return json.dumps(value, indent=2).encode("ascii")
    try:
        fast = orjson.dumps(value) if orjson is not None else b""
    except TypeError:  # orjson.JSONEncodeError: what it refuses, the json module writes
        fast = b""
    if fast and fast.isascii():
        return fast
    # The value is built here from plain data, never cyclic: no need to track every
    # container the encoder enters (~5 ms of a 10,000-deletion plan).
    return json.dumps(value, separators=(",", ":"), check_circular=False).encode("ascii")


def ladder_json(ladder: LadderPlan, plan: Plan) -> dict[str, Any]:
    """``plan --json``'s ``ladder``: the lossless rungs' actions, and per filesystem which
    rung frees what (deletion last)."""
    from diskguard.retention.outcome import rung_fields

    return {
        "rungs": {
            fs.mount: rung_fields(ladder, fs.mount, fs.chosen_bytes, fs.chosen_count)
            for fs in plan.filesystems
        },
        "evictions": [
            {
                "topic": ev.topic,
                "local_retention_ms": ev.local_retention_ms,
                "cutoff_ms": ev.cutoff_ms,
                "bytes": ev.bytes,
                "segments": [
                    {
                        "log_dir": d.log_dir,
                        "partition": d.partition,
                        "base_offset": d.base_offset,
                        "next_offset": d.next_offset,
                        "bytes": d.bytes,
                        "max_timestamp_ms": d.max_timestamp_ms,
                    }
                    for d in ev.segments
                ],
            }
            for ev in ladder.evictions
        ],
        "moves": [
            {
                "topic": m.topic,
                "partition": m.partition,
                "source_dir": m.source_dir,
                "target_dir": m.target_dir,
                "bytes": m.bytes,
                "expected_s": round(m.expected_s, 1),
            }
            for m in ladder.moves
        ],
    }
