"""What one retention cycle did: the ``enforce --once`` exit code that follows from it and
the events it logs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diskguard.errors import ExitCode
from diskguard.host import fsusage
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.kafkalog.scan import ScanResult
from diskguard.logs import get_logger
from diskguard.retention.audit import why_fields
from diskguard.retention.ladder import DELETE, LadderPlan
from diskguard.retention.limits import Standing
from diskguard.retention.mode import DRY_RUN, REFUSED, ModeDecision
from diskguard.retention.planner import FilesystemPlan, Plan
from diskguard.retention.stuck import UNREACHABLE_DETAIL

if TYPE_CHECKING:
    from diskguard.retention.rungaudit import RungResult

log = get_logger("diskguard.retention")

#: ``enforce --once`` runs at most this many rounds: the cycle, and re-plans after partitions
#: were set aside (``another_round``). A bound on time, not the rule that stops it.
ENFORCE_MAX_ROUNDS = 5


@dataclass(frozen=True)
class CycleOutcome:
    mode: ModeDecision
    scan: ScanResult
    plan: Plan
    results: tuple[Any, ...] = ()
    warnings: tuple[str, ...] = ()
    duration_s: float = 0.0
    #: mount -> df's view measured (statvfs) after the cycle acted; a None value means the
    #: measurement failed. None when the cycle did not act (``plan``): then the scan's usage
    #: is the latest there is.
    measured: Mapping[str, FilesystemUsage | None] | None = None
    #: mount -> bytes someone else will still remove after this cycle (``Ceilings``: broker
    #: mode, what was pending at the scan plus what the broker accepted now).
    pending_left: Mapping[str, int] = field(default_factory=dict)
    #: mount -> the usage after the cycle, net of ``pending_left``, against the ceiling
    #: (``Ceilings.settled``); None when it could not be measured.
    settled: Mapping[str, Standing | None] = field(default_factory=dict)
    #: The lossless rungs' plan (broker mode) and what came of its actions.
    ladder: LadderPlan = field(default_factory=LadderPlan)
    rungs: tuple[RungResult, ...] = ()

    @property
    def refused(self) -> bool:
        return self.mode.mode == REFUSED and bool(self.plan.deletions)

    @property
    def failed(self) -> tuple[Any, ...]:
        return tuple(r for r in self.results if not r.ok)

    @property
    def freed_bytes(self) -> int:
        return sum(r.freed_bytes for r in self.results if r.ok)

    def usage_after(self, fs: FilesystemPlan) -> FilesystemUsage | None:
        """``fs`` as measured after the cycle (None: the measurement failed)."""
        if self.measured is None:
            return fs.usage
        return self.measured.get(fs.mount)

    def pending_after(self, fs: FilesystemPlan) -> int:
        """Bytes of ``fs`` someone else will still remove after this cycle."""
        return self.pending_left.get(fs.mount, 0)

    def at_or_under_limit(self, fs: FilesystemPlan) -> bool:
        """Measured usage, net of ``pending_after``, at or under the usage limit.

        The measurement, not the plan, decides: a deletion can free less than planned (a file
        still open elsewhere, a hard link made since the scan) and the disk keeps filling
        while the cycle runs. A failed measurement is not "under".
        """
        standing = self.settled.get(fs.mount)
        return standing is not None and not standing.over

    def exit_code(self) -> ExitCode:
        """``enforce --once``: 0 at/under limit measured after the cycle (net of what the
        broker will remove), 1 limit unreachable / a deletion failed / still over, 3 refused.
        """
        if self.refused:
            return ExitCode.REFUSED
        if not self.plan.reachable or self.failed:
            return ExitCode.FAILED
        if self.mode.mode == DRY_RUN and self.plan.deletions:
            return ExitCode.FAILED
        if not all(self.at_or_under_limit(fs) for fs in self.plan.filesystems):
            return ExitCode.FAILED
        return ExitCode.OK


def measure_after(scan: ScanResult) -> dict[str, FilesystemUsage | None]:
    """statvfs of every filesystem of ``scan`` again, after acting (None: it failed):
    exit codes and events report what the disk says now, not what the plan hoped deleting
    would free."""
    return {
        fs.usage.mount: fsusage.usage_of_any(
            [d.path for d in fs.log_dirs], fs.usage.mount, fs.usage.device
        )
        for fs in scan.filesystems
    }


def another_round(rounds: Sequence[CycleOutcome]) -> bool:
    """``enforce --once``: plan again at once, now without the partitions the last round set
    aside (a deletion failed for a lasting reason, ``setaside``)?

    The daemon's next cycle does exactly that. A one-shot run has no next cycle: from cron,
    each run would stop at the same refused oldest segments and leave the disk over its
    limit while other topics' segments could go. So: only while a filesystem where such a
    failure happened is still over its limit, and not after two rounds in a row that
    deleted nothing (every partition refusing: the daemon's ``delete_failed`` stuck rule).
    """
    last = rounds[-1]
    if len(rounds) >= ENFORCE_MAX_ROUNDS:
        return False
    lasting = {r.deletion.mount for r in last.failed if r.lasting}
    if not any(
        fs.mount in lasting and not last.at_or_under_limit(fs) for fs in last.plan.filesystems
    ):
        return False
    return not (len(rounds) >= 2 and not any(r.ok for o in rounds[-2:] for r in o.results))


def enforce_exit_code(rounds: Sequence[CycleOutcome]) -> ExitCode:
    """The last round's ``exit_code``, but 1 if any earlier round's deletion failed: the run
    says "a deletion failed" even when the next round got the disk under its limit (the
    operator's ACL or file flag still needs fixing)."""
    code = rounds[-1].exit_code()
    if code == ExitCode.OK and any(o.failed for o in rounds[:-1]):
        return ExitCode.FAILED
    return code


def rung_fields(ladder: LadderPlan, mount: str, deleted: int, count: int) -> list[dict[str, Any]]:
    """Which rung frees what on ``mount``, in the order climbed: the lossless rungs, then
    deletion (``plan --json``, ``retention_cycle``)."""
    out = [
        {"rung": r.rung, "bytes": r.bytes, "count": r.count, "latency_s": round(r.latency_s, 1)}
        for r in ladder.steps.get(mount, ())
    ]
    if count:
        out.append({"rung": DELETE, "bytes": deleted, "count": count, "latency_s": None})
    return out


def log_cycle(outcome: CycleOutcome, quiet: frozenset[str] = frozenset()) -> None:
    """The events of a cycle that acted: one per deletion, one ``retention_cycle`` per
    filesystem that needed space (unless ``quiet``: stuck, said already)."""
    for res in outcome.results:
        d = res.deletion
        if res.ok:
            log.info(
                "segment_deleted",
                topic=d.topic,
                partition=d.partition,
                base_offset=d.base_offset,
                next_offset=d.next_offset,
                bytes=d.bytes,
                mode=res.mode,
                log_dir=d.log_dir,
                mount=d.mount,
                **why_fields(d),
            )
        elif d.mount not in quiet:  # else stuck on failed deletions, said already
            log.error(
                "segment_delete_failed",
                topic=d.topic,
                partition=d.partition,
                base_offset=d.base_offset,
                mode=res.mode,
                error=res.error,
                **why_fields(d),
            )
    for fs in outcome.plan.filesystems:
        climbed = fs.mount in outcome.ladder.steps
        if (not fs.over_limit and not fs.chosen_count and not climbed) or fs.mount in quiet:
            continue
        measured = outcome.usage_after(fs)
        after = round(measured.usage_percent, 3) if measured is not None else None
        log.info(
            "retention_cycle",
            mount=fs.mount,
            mode=outcome.mode.mode,
            usage_before=fs.usage_percent,
            usage_after=after,
            limit_percent=fs.limit_percent,
            target_percent=fs.target_percent,
            pending_reclaim_bytes=fs.pending_reclaim_bytes,
            excess_bytes=fs.excess_bytes,
            chosen_count=fs.chosen_count,
            chosen_bytes=fs.chosen_bytes,
            rungs=rung_fields(outcome.ladder, fs.mount, fs.chosen_bytes, fs.chosen_count),
            duration_ms=round(outcome.duration_s * 1000, 1),
        )
        if not fs.reachable:
            log.error(
                "retention_target_unreachable",
                mount=fs.mount,
                unreachable_bytes=fs.unreachable_bytes,
                reason=fs.halted or UNREACHABLE_DETAIL,
            )
