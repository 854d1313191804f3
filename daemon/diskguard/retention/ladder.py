"""The ladder: free space without losing data first, and delete only what is left. Pure.

A filesystem over its limit (``limits.stand``: over, and by how much) climbs, in order:

1. ``tiered``: uploaded local segments of tiered topics (``remote.storage.enable=true``). The
   topic's ``local.retention.ms`` is lowered so that the broker drops them at its next
   retention check; consumers read them from remote storage. Nothing is lost. Segments not
   uploaded yet (last offset above the partition's highest offset in remote storage) cannot
   go this way. Globally oldest first (the same walk as deletion), so one time cutoff per
   topic says which go: the broker drops a segment whose largest timestamp is older than
   ``now - local.retention.ms``.
2. ``cordon``: no space is freed, no new replica lands in the filling dir; driven by the
   alert level (``cordon``), not by the excess, so it has no step here.
3. ``balance``: whole replicas of a JBOD broker move to a log dir on another disk with room
   (AlterReplicaLogDirs). The target must stay under its own target after receiving the
   whole copy (the source frees only once the copy has caught up and swapped), largest cold
   replicas first. A move frees space only after its copy (bytes / measured copy rate) and
   the broker's delete delay: slower than deletion, it is used only if the disk holds its
   ceiling until then, and it covers the growth until then too.
4. ``delete``: global-oldest deletion (``planner``) of what is left.

Each rung's latency is in its step (``Rung``): tiered eviction lands at the broker's next
retention check plus its delete delay, like DeleteRecords; a move when its copy is done. A
filesystem not over its limit at the retention check's horizon may already be over at a
move's: moves are then planned early (``early``), since later they would come too late and
only deletion would hold the ceiling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir, Partition
from diskguard.retention.limits import Limits, Standing
from diskguard.retention.planner import Deletion, SegmentReader, oldest_covering

TIERED = "tiered"
CORDON = "cordon"
BALANCE = "balance"
DELETE = "delete"
#: The rungs in the order they are climbed.
RUNGS = (TIERED, CORDON, BALANCE, DELETE)

#: A replica written to within this many seconds is "hot": its copy chases the writes, so it
#: moves only after every cold one.
HOT_S = 60.0


@dataclass(frozen=True)
class Rung:
    """What one rung does for one filesystem: bytes it frees, when, and why (plan, audit)."""

    rung: str
    bytes: int
    count: int
    latency_s: float
    why: str


@dataclass(frozen=True)
class TopicEviction:
    """Rung 1 for one topic: lower ``local.retention.ms`` to ``local_retention_ms`` so the
    broker drops these uploaded segments (largest timestamp at most ``cutoff_ms``)."""

    topic: str
    local_retention_ms: int
    cutoff_ms: int
    segments: tuple[Deletion, ...]

    @property
    def bytes(self) -> int:
        return sum(d.bytes for d in self.segments)

    @property
    def mounts(self) -> tuple[str, ...]:
        return tuple(sorted({d.mount for d in self.segments}))


@dataclass(frozen=True)
class Move:
    """Rung 3: one replica to another log dir of this broker."""

    topic: str
    partition: int
    source_dir: str
    target_dir: str
    bytes: int
    mount: str
    target_mount: str
    #: When the source's space is expected back: copy time + the broker's delete delay.
    expected_s: float


@dataclass(frozen=True)
class TieredFacts:
    """What rung 1 needs from the broker: the tiered topics and how far each partition is
    uploaded (``(topic, partition) -> highest offset in remote storage``, -1: nothing)."""

    topics: frozenset[str] = frozenset()
    uploaded: Mapping[tuple[str, int], int] = field(default_factory=dict)
    now_ms: int = 0


@dataclass(frozen=True)
class MoveCandidate:
    """A replica that could move: its size as the broker reports it, and whether it is hot."""

    topic: str
    partition: int
    log_dir: str
    bytes: int
    hot: bool = False


@dataclass(frozen=True)
class TargetDir:
    """A log dir that could receive replicas: online, not cordoned, on another disk."""

    path: str
    usage: FilesystemUsage
    limits: Limits
    #: Bytes of moves into it still to be copied (in flight).
    incoming: int = 0

    def room(self) -> int:
        """Bytes it can take and stay under its own target, counting the whole copy (it is
        whole on the target before the source frees) and a check period of its own growth."""
        goal = self.usage.used_bytes_at(self.limits.target_percent)
        return goal - self.usage.used_bytes - self.incoming - self.limits.period_growth_bytes


@dataclass(frozen=True)
class BalanceFacts:
    """What rung 3 needs: candidates by log dir, the dirs that could take them, the copy rate
    (measured, else assumed) and the broker's delete delay."""

    candidates: tuple[MoveCandidate, ...] = ()
    targets: tuple[TargetDir, ...] = ()
    rate_bytes_per_s: float = 0.0
    delete_delay_s: float = 0.0


@dataclass(frozen=True)
class LadderPlan:
    """The lossless rungs' actions, and what each filesystem's deletion plan is left with."""

    evictions: tuple[TopicEviction, ...] = ()
    moves: tuple[Move, ...] = ()
    #: mount -> the rungs used, in order (``delete`` is the deletion plan's, not listed here).
    steps: Mapping[str, tuple[Rung, ...]] = field(default_factory=dict)
    #: mount -> bytes of the excess the rungs cover: deletion plans for the rest.
    covered: Mapping[str, int] = field(default_factory=dict)


def uploaded_prefix(part: Partition, uploaded: int) -> Partition | None:
    """``part`` cut to its closed, uploaded candidates (last offset at most ``uploaded``), as
    an unprotected partition the deletion walk can take; None when none is uploaded."""
    count = 0
    while (cand := part.candidate(count)) is not None and cand[1] - 1 <= uploaded:
        count += 1
    if count == 0:
        return None
    keep = len(part.reclaiming) + count + 1
    return replace(part, base_offsets=part.base_offsets[:keep], protected=False)


def _tiered(
    fs: Filesystem, standing: Standing, facts: TieredFacts, read: SegmentReader
) -> list[Deletion]:
    """Rung 1: the oldest uploaded segments of tiered topics covering the excess."""
    log_dirs = []
    for log_dir in fs.log_dirs:
        parts = []
        for part in log_dir.partitions:
            top = facts.uploaded.get((part.topic, part.partition))
            if part.topic in facts.topics and top is not None and top >= 0:
                cut = uploaded_prefix(part, top)
                if cut is not None:
                    parts.append(cut)
        if parts:
            log_dirs.append(LogDir(log_dir.path, log_dir.mount, tuple(parts)))
    if not log_dirs:
        return []
    chosen = oldest_covering(Filesystem(fs.usage, tuple(log_dirs)), standing, read, TIERED)
    # Time retention cannot drop a segment stamped in the future; nor, being a prefix, what
    # follows it in its partition.
    stopped: set[tuple[str, int, str]] = set()
    kept = []
    for d in chosen:
        key = (d.topic, d.partition, d.log_dir)
        if key in stopped or d.max_timestamp_ms >= facts.now_ms:
            stopped.add(key)
            continue
        kept.append(d)
    return kept


def evictions(chosen: Sequence[Deletion], now_ms: int) -> tuple[TopicEviction, ...]:
    """Per topic, the ``local.retention.ms`` that drops its chosen segments: the broker drops
    a segment once ``now - largest timestamp > local.retention.ms``."""
    by_topic: dict[str, list[Deletion]] = {}
    for d in chosen:
        by_topic.setdefault(d.topic, []).append(d)
    out = []
    for topic, segments in sorted(by_topic.items()):
        cutoff = max(d.max_timestamp_ms for d in segments)
        out.append(TopicEviction(topic, max(1, now_ms - cutoff), cutoff, tuple(segments)))
    return tuple(out)


def _move_latency(nbytes: int, facts: BalanceFacts) -> float:
    rate = facts.rate_bytes_per_s
    return (nbytes / rate if rate > 0 else float("inf")) + facts.delete_delay_s


def _moves(
    fs: Filesystem,
    standing: Standing,
    need: int,
    evicted: int,
    facts: BalanceFacts,
    rooms: dict[str, int],
) -> list[Move]:
    """Rung 3: replicas off ``fs``, largest cold ones first, while the targets have room,
    the disk holds its ceiling until the moves land and the growth until then is covered."""
    here = {d.path for d in fs.log_dirs}
    dev = fs.usage.device
    targets = [t for t in facts.targets if t.usage.device != dev and t.path not in here]
    if not targets or facts.rate_bytes_per_s <= 0:
        return []
    limits = standing.limits
    rate = limits.growth_bytes_per_s
    ceiling = fs.usage.used_bytes_at(limits.limit_percent)
    base = fs.usage.used_bytes - standing.pending_bytes - evicted
    candidates = sorted(
        (c for c in facts.candidates if c.log_dir in here and c.bytes > 0),
        key=lambda c: (c.hot, -c.bytes, c.topic, c.partition),
    )
    chosen: list[Move] = []
    moved = 0
    for cand in candidates:
        latency = _move_latency(moved + cand.bytes, facts)
        if latency > limits.reclaim_latency_s and base + rate * latency > ceiling:
            # Slower than deletion, and lands after the disk crossed its ceiling: deletion
            # must hold it.
            break
        target = max(targets, key=lambda t: (rooms[t.path], t.path))
        if rooms[target.path] < cand.bytes:
            continue  # too big for any target; a smaller one may fit
        rooms[target.path] -= cand.bytes
        moved += cand.bytes
        chosen.append(
            Move(
                cand.topic,
                cand.partition,
                cand.log_dir,
                target.path,
                cand.bytes,
                fs.usage.mount,
                target.usage.mount,
                latency,
            )
        )
        grown = rate * max(0.0, latency - limits.reclaim_latency_s)
        if moved >= need + grown:
            break
    return chosen


#: A filesystem's standing if space asked now came back after ``latency`` seconds
#: (``Ceilings.standing_at``): how the ladder asks whether a move's horizon is over.
StandingAt = Callable[[Filesystem, float], Standing]


def climb(
    filesystems: Sequence[Filesystem],
    standing_of: Callable[[Filesystem], Standing],
    read: SegmentReader,
    tiered: TieredFacts | None = None,
    balance: BalanceFacts | None = None,
    standing_at: StandingAt | None = None,
) -> LadderPlan:
    """The lossless rungs for every filesystem over its limit (and, for moves, for one that
    will be over by the time a move could land: ``standing_at``): what they do, and the
    excess they cover."""
    all_evicted: list[Deletion] = []
    moves: list[Move] = []
    steps: dict[str, tuple[Rung, ...]] = {}
    covered: dict[str, int] = {}
    rooms = {t.path: t.room() for t in balance.targets} if balance else {}
    for fs in filesystems:
        standing = standing_of(fs)
        mount = fs.usage.mount
        rungs: list[Rung] = []
        excess = standing.excess_bytes if standing.over else 0
        evicted = 0
        if excess > 0 and tiered is not None:
            chosen = _tiered(fs, standing, tiered, read)
            evicted = sum(d.bytes for d in chosen)
            if chosen:
                all_evicted.extend(chosen)
                rungs.append(
                    Rung(
                        TIERED,
                        evicted,
                        len(chosen),
                        standing.limits.reclaim_latency_s,
                        "uploaded to remote storage: dropped locally at the broker's next "
                        "retention check, still readable from remote",
                    )
                )
        if balance is not None and balance.candidates:
            need = excess - evicted
            if need <= 0 and excess == 0 and standing_at is not None:
                need = _early_need(fs, standing, balance, standing_at)
            fs_moves = _moves(fs, standing, need, evicted, balance, rooms) if need > 0 else []
            if fs_moves:
                moves.extend(fs_moves)
                rungs.append(
                    Rung(
                        BALANCE,
                        sum(m.bytes for m in fs_moves),
                        len(fs_moves),
                        max(m.expected_s for m in fs_moves),
                        "whole replicas to another log dir of this broker with room: "
                        "the broker copies, swaps and deletes the old dir",
                    )
                )
        if rungs:
            steps[mount] = tuple(rungs)
            covered[mount] = sum(r.bytes for r in rungs)
    now = tiered.now_ms if tiered is not None else 0
    return LadderPlan(evictions(all_evicted, now), tuple(moves), steps, covered)


def _early_need(
    fs: Filesystem, standing: Standing, facts: BalanceFacts, standing_at: StandingAt
) -> int:
    """Not over at the retention check's horizon: over at a move's? Then the excess at that
    horizon, to move now (later a move would come too late and only deletion would do)."""
    limits = standing.limits
    if limits.growth_bytes_per_s <= 0:
        return 0
    here = {d.path for d in fs.log_dirs}
    sizes = [c.bytes for c in facts.candidates if c.log_dir in here and not c.hot]
    if not sizes:
        return 0
    horizon = _move_latency(max(sizes), facts)
    if horizon <= limits.reclaim_latency_s:
        return 0
    later = standing_at(fs, horizon)
    return later.excess_bytes if later.over else 0


def without_evicted(
    filesystems: Sequence[Filesystem], ladder: LadderPlan
) -> tuple[Filesystem, ...]:
    """``filesystems`` with the segments the tiered rung evicts no longer deletion candidates
    (their partitions' start raised past them): a tiered topic deletion may take
    (``ladder.delete_tiered_topics``) must not have its evicted segments counted twice."""
    start: dict[tuple[str, str, int], int] = {}
    for ev in ladder.evictions:
        for d in ev.segments:
            key = (d.log_dir, d.topic, d.partition)
            start[key] = max(start.get(key, 0), d.next_offset)
    if not start:
        return tuple(filesystems)
    out = []
    for fs in filesystems:
        log_dirs = []
        for log_dir in fs.log_dirs:
            parts = tuple(
                replace(p, log_start_offset=max(p.log_start_offset or 0, raised))
                if (raised := start.get((p.log_dir, p.topic, p.partition))) is not None
                else p
                for p in log_dir.partitions
            )
            log_dirs.append(replace(log_dir, partitions=parts))
        out.append(replace(fs, log_dirs=tuple(log_dirs)))
    return tuple(out)
