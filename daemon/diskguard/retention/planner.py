"""The KIP-61 planner: which segments go, in which order, and why. Pure.

Size: over 400 lines on purpose: the data, the heap key and the walk are one algorithm read
top to bottom; split, each half would need the other to be understood. (The trigger and the
excess, "over, and by how much", are ``limits.stand``.)

Given each filesystem's usage and the partitions on it, pick the *globally oldest* closed
segments across all topics until their bytes cover the excess over the target. Rules that
make it safe (mirroring Kafka's ``UnifiedLog.deleteOldSegments``):

- per partition only a prefix of segments can go (never a hole), never the active one;
- protected topics are never candidates;
- a segment is worth its *freeable* bytes (per inode): one whose files have another hard link
  (``SegmentInfo.shared_files``) would lose records and free nothing, so it is not a
  candidate and, the rule being a prefix, its partition goes no further this cycle — deleting
  data for no gain is the worst outcome, worse than missing the target;
- likewise a segment whose extents a snapshot or a reflinked copy shares (FIEMAP,
  ``SegmentInfo.shared_extent_files``); and a filesystem where earlier deletions did not free
  their space (``Standing.halted``) gets nothing chosen at all;
- bytes already on their way out (pending reclaim) are subtracted first (``limits.stand``),
  or every cycle under a running broker would delete again what the broker has not yet
  removed;
- minimal: stop as soon as the excess is covered.

Segment details (bytes, timestamps) are read lazily through ``SegmentReader`` only for the
partition heads popped from the heap, so planning a 3M-file tree reads a few thousand files.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from diskguard.kafkalog.model import (
    Filesystem,
    FilesystemUsage,
    NotLiveDir,
    Partition,
    SegmentInfo,
)
from diskguard.retention.limits import Limits, Standing, dir_excess, stand
from diskguard.retention.order import (
    DISK_USAGE,
    MAX_BYTES,
    MEASURED,
    PREDICTED,
    HeadKey,
    Why,
    new_named,
    tie_breaker,
)


class SegmentReader(Protocol):
    """Reads one segment's bytes and age; the edge (``scan``) implements it against disk."""

    def __call__(self, partition: Partition, base_offset: int) -> SegmentInfo: ...


@dataclass(frozen=True)
class Deletion:
    """One chosen segment. ``next_offset`` is the DeleteRecords offset that removes it."""

    log_dir: str
    topic: str
    partition: int
    base_offset: int
    next_offset: int
    max_timestamp_ms: int
    bytes: int
    files: tuple[str, ...]
    mount: str
    timestamp_source: str = "timeindex"
    #: Why it was chosen: "disk_usage_percent" or "max_bytes".
    reason: str = "disk_usage_percent"
    #: group -> records of this segment the group has not consumed yet.
    unconsumed_records: Mapping[str, int] = field(default_factory=dict)
    #: Groups among ``unconsumed_records`` that consume the topic but have committed nothing on
    #: this partition: counted as having read none of it.
    groups_without_offset: tuple[str, ...] = ()
    #: What the planner knew when it chose it (None: not chosen by a plan, e.g. recovered
    #: from the offline journal).
    why: Why | None = None
    #: Broker mode: the partition's leader (DeleteRecords goes to it) and replicas, and the
    #: other brokers whose replicas the trim shortens too (empty: unknown, or offline).
    leader: int | None = None
    replicas: tuple[int, ...] = ()
    also_trims: tuple[int, ...] = ()


@dataclass(frozen=True)
class DeletionResult:
    """The outcome of one deletion, as the executors return it and the audit log records it.

    ``freed_bytes``: offline, the allocated bytes unlinked (``st_blocks * 512``); broker, the
    segment's bytes, which the broker frees at its next retention check + file delete delay.
    ``refused``: nothing was attempted (a guard rail or the ``.lock`` said no).
    ``lasting``: the failure will recur until something outside diskguard changes (an ACL,
    a file's flags): the cycle sets the partition aside (``setaside``) instead of retrying.
    ``whole_topic``: that refusal is the topic's (an ACL, the topic's cleanup.policy), so it
    holds for every partition of the topic: all of them are set aside at once.
    """

    deletion: Deletion
    ok: bool
    freed_bytes: int
    mode: str = "offline"
    error: str | None = None
    refused: bool = False
    lasting: bool = False
    whole_topic: bool = False


@dataclass(frozen=True)
class FilesystemPlan:
    mount: str
    device: str
    log_dirs: tuple[str, ...]
    total_bytes: int
    used_bytes: int
    available_bytes: int
    usage_percent: float
    limit_percent: float
    target_percent: float
    pending_reclaim_bytes: int
    excess_bytes: int
    chosen_bytes: int = 0
    chosen_count: int = 0
    #: Excess left after every deletable segment was chosen (only active/protected remain).
    unreachable_bytes: int = 0
    #: Usage expected when space asked for now is freed, before this plan's deletions:
    #: ``used + growth - pending`` (equals ``used - pending`` without a forecast).
    predicted_used_bytes: int = 0
    #: True when only the forecast (not today's usage) crossed the ceiling.
    predicted_trigger: bool = False
    growth_bytes_per_s: float = 0.0
    reclaim_latency_s: float = 0.0
    reclaim_period_s: float = 0.0
    latency_source: str = "none"
    #: How far ahead the forecast looked (the span its rate was measured over); None: as far
    #: as latency and period reach.
    forecast_horizon_s: float | None = None
    #: Why nothing is chosen on this filesystem although it is over: earlier deletions did not
    #: free their space (``Standing.halted``); "" otherwise.
    halted: str = ""

    @property
    def usage(self) -> FilesystemUsage:
        """The filesystem's usage at the scan, as ``df`` saw it."""
        return FilesystemUsage(
            self.mount, self.device, self.total_bytes, self.used_bytes, self.available_bytes
        )

    @property
    def predicted_usage_percent(self) -> float:
        denominator = self.used_bytes + self.available_bytes
        return 100.0 * self.predicted_used_bytes / denominator if denominator else 0.0

    @property
    def over_limit(self) -> bool:
        return self.excess_bytes > 0

    @property
    def over_usage_limit(self) -> bool:
        """Usage above ``limit_percent`` on the exact bytes, as the trigger decides it
        (``usage_percent`` is rounded to 3 decimals; ``max_bytes`` excess is not counted)."""
        return self.usage.above(self.limit_percent)

    @property
    def reachable(self) -> bool:
        return self.unreachable_bytes <= 0


@dataclass(frozen=True)
class ProtectedTopic:
    """A topic on a guarded disk none of whose segments may go, and why (``plan`` shows it)."""

    topic: str
    reason: str


@dataclass(frozen=True)
class Plan:
    filesystems: tuple[FilesystemPlan, ...]
    deletions: tuple[Deletion, ...]
    #: Protected topics with a partition on a planned filesystem, sorted by topic.
    protected: tuple[ProtectedTopic, ...] = ()
    #: ``-stray``/``-future`` partition dirs on a planned filesystem (never deleted).
    not_live: tuple[NotLiveDir, ...] = ()

    @property
    def reachable(self) -> bool:
        return all(fs.reachable for fs in self.filesystems)


#: (topic, partition) -> group -> committed offset (``NO_OFFSET``: the group consumes the topic
#: but has committed nothing on this partition).
CommittedOffsets = Mapping[tuple[str, int], Mapping[str, int]]

#: A consumer group's offset on a partition it has committed nothing for (Kafka's -1).
NO_OFFSET = -1


def unconsumed_records(
    committed: Mapping[str, int], base_offset: int, next_offset: int
) -> dict[str, int]:
    """Records in ``[base_offset, next_offset)`` each group has not consumed yet."""
    out: dict[str, int] = {}
    for group, offset in committed.items():
        missing = next_offset - max(base_offset, offset)
        if missing > 0:
            out[group] = min(missing, next_offset - base_offset)
    return out


def with_missing_offsets(
    committed: CommittedOffsets, partitions: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], dict[str, int]]:
    """Fill in ``NO_OFFSET`` for each group that consumes a topic (has a committed offset on
    some partition of it) but none on one of ``partitions``.

    OffsetFetch for all of a group's partitions answers only those with a commit, so a
    partition the group has not read yet is simply absent; without this, absence would read as
    "consumed everything" and its unread segments would be preferred for deletion. A group with
    no committed offset anywhere in a topic is not counted as consuming it.
    """
    consumers: dict[str, set[str]] = {}
    for (topic, _partition), groups in committed.items():
        for group, offset in groups.items():
            if offset >= 0:
                consumers.setdefault(topic, set()).add(group)
    out: dict[tuple[str, int], dict[str, int]] = {}
    for key in {*committed, *partitions}:
        groups_of_topic = consumers.get(key[0])
        if not groups_of_topic:
            continue
        have = committed.get(key, {})
        out[key] = {
            group: offset if (offset := have.get(group, NO_OFFSET)) >= 0 else NO_OFFSET
            for group in sorted(groups_of_topic)
        }
    return out


def groups_without_offset(groups: Mapping[str, int]) -> tuple[str, ...]:
    """The groups of one partition's ``with_missing_offsets`` entry that have no offset."""
    return tuple(sorted(group for group, offset in groups.items() if offset < 0))


#: A partition's oldest remaining candidate on the heap: ``(key, index, partition, info,
#: next_offset, groups)`` (``groups``: the partition's committed offsets per consumer group,
#: looked up once for the key and kept for the deletion). ``HeadKey`` orders it
#: (``order``): age first, then consumed, then led here, then names.
Head = tuple[HeadKey, int, Partition, SegmentInfo, int, Mapping[str, int] | None]


class HeadQueue(Protocol):
    """Partition heads, oldest key first: what the plan walks (``plan_filesystem``).

    ``tied``: whether the head ``pop`` returned last had a rival as old (the same largest
    timestamp) among the heads queued with it; True where not known. Only ties can let the
    broker's facts (consumed, led here) reorder a walk (``with_facts``)."""

    tied: bool

    def pop(self) -> Head | None:
        """The head with the smallest key, or None when no candidate is left."""

    def advance(self, head: Head) -> None:
        """``head``, the one just popped, was chosen: its partition's next candidate joins."""

    def close(self) -> None:
        """The walk is over (a queue that works elsewhere stops there)."""


class LocalHeads:
    """Every partition's head on one heap, dated through ``read`` as it joins: a head is
    read only when its partition's previous one was chosen."""

    def __init__(
        self,
        parts: Iterable[Partition],
        read: SegmentReader,
        committed: CommittedOffsets,
        led_here: Collection[tuple[str, int]] | None = None,
    ) -> None:
        self._read = read
        self._committed = committed
        self._led_here = led_here
        heap = [h for part in parts if (h := _head(part, 0, read, committed, led_here))]
        heapq.heapify(heap)
        self._heap = heap
        self.tied = True

    def pop(self) -> Head | None:
        heap = self._heap
        if not heap:
            return None
        head = heapq.heappop(heap)
        # The next smallest key holds the smallest timestamp left: as old, or older?
        self.tied = bool(heap) and heap[0][0][0] == head[0][0]
        return head

    def advance(self, head: Head) -> None:
        nxt = _head(head[2], head[1] + 1, self._read, self._committed, self._led_here)
        if nxt is not None:
            heapq.heappush(self._heap, nxt)

    def close(self) -> None:
        self._heap = []


class MergedHeads:
    """Several queues of disjoint partitions as one: their keys are unique, so taking the
    smallest front each time is the order one heap of them all would give. The front of
    the queue a head came from is taken at the next ``pop``, after ``advance`` may have
    added that head's successor to it."""

    def __init__(self, queues: Sequence[HeadQueue]) -> None:
        self._queues = queues
        self._fronts: list[tuple[HeadKey, int, Head]] = []
        #: Per queue: whether its front was tied within it when taken.
        self._front_tied = [True] * len(queues)
        for i in range(len(queues)):
            self._take(i)
        self._last: int | None = None
        self.tied = True

    def _take(self, i: int) -> None:
        queue = self._queues[i]
        head = queue.pop()
        if head is not None:
            self._front_tied[i] = queue.tied
            heapq.heappush(self._fronts, (head[0], i, head))

    def pop(self) -> Head | None:
        if self._last is not None:
            self._take(self._last)
            self._last = None
        fronts = self._fronts
        if not fronts:
            return None
        _key, self._last, head = heapq.heappop(fronts)
        # Tied within its own queue, or with another queue's front (the oldest of that one).
        self.tied = self._front_tied[self._last] or (bool(fronts) and fronts[0][0][0] == head[0][0])
        return head

    def advance(self, head: Head) -> None:
        """``head`` must be the one just popped (as in ``plan_filesystem``)."""
        assert self._last is not None
        self._queues[self._last].advance(head)

    def close(self) -> None:
        for queue in self._queues:
            queue.close()


#: Makes the queue a plan walks, from the filesystem's partitions and the plan's inputs:
#: ``LocalHeads``, or an edge's that dates some heads elsewhere (``parallelheads``).
HeadsFactory = Callable[
    [Sequence[Partition], SegmentReader, "CommittedOffsets", Collection[tuple[str, int]] | None],
    HeadQueue,
]


def plan_filesystem(
    fs: Filesystem,
    limits: Limits,
    read: SegmentReader,
    committed: CommittedOffsets | None = None,
    led_here: Collection[tuple[str, int]] | None = None,
    heads: HeadsFactory = LocalHeads,
) -> tuple[FilesystemPlan, list[Deletion]]:
    """Plan one filesystem under ``limits``, counting the scan's pending reclaim."""
    standing = stand(fs.usage, limits, fs.pending_reclaim_bytes)
    return _plan_filesystem(fs, standing, read, committed, led_here, heads)


def _plan_filesystem(
    fs: Filesystem,
    standing: Standing,
    read: SegmentReader,
    committed: CommittedOffsets | None,
    led_here: Collection[tuple[str, int]] | None,
    heads: HeadsFactory,
    covered: int = 0,
    trace: WalkTrace | None = None,
) -> tuple[FilesystemPlan, list[Deletion]]:
    """Plan one filesystem: the global-oldest prefix set covering its excess, less the
    ``covered`` bytes the lossless rungs free first (``ladder``)."""
    limits = standing.limits
    initial_excess = standing.excess_bytes
    initial_dir_excess = dir_excess(fs, limits)
    excess = initial_excess - max(0, covered)
    log_dir_excess = dict(initial_dir_excess)
    committed = _consumers_offsets(fs, committed)
    chosen: list[Deletion] = []
    context = _Context(standing, initial_dir_excess)
    fs_trace = None
    if trace is not None:
        fs_trace = trace.filesystems[fs.usage.mount] = _FsTrace(fs, standing, covered, context)
    if excess + sum(log_dir_excess.values()) > 0 and not standing.halted:
        parts = [part for log_dir in fs.log_dirs for part in log_dir.partitions]
        queue = heads(parts, read, committed, led_here)
        try:
            excess = _walk(queue, excess, log_dir_excess, context, chosen, fs_trace)
        finally:
            queue.close()

    chosen_bytes = sum(d.bytes for d in chosen)
    unreachable = max(0, excess) + sum(max(0, v) for v in log_dir_excess.values())
    usage = fs.usage
    plan = FilesystemPlan(
        mount=usage.mount,
        device=usage.device,
        log_dirs=tuple(d.path for d in fs.log_dirs),
        total_bytes=usage.total_bytes,
        used_bytes=usage.used_bytes,
        available_bytes=usage.available_bytes,
        usage_percent=round(usage.usage_percent, 3),
        limit_percent=limits.limit_percent,
        target_percent=limits.target_percent,
        pending_reclaim_bytes=standing.pending_bytes,
        excess_bytes=initial_excess + sum(initial_dir_excess.values()),
        chosen_bytes=chosen_bytes,
        chosen_count=len(chosen),
        unreachable_bytes=unreachable,
        predicted_used_bytes=standing.predicted_used_bytes,
        predicted_trigger=standing.over and standing.predicted_only,
        growth_bytes_per_s=limits.growth_bytes_per_s,
        reclaim_latency_s=limits.reclaim_latency_s,
        reclaim_period_s=limits.reclaim_period_s,
        latency_source=limits.latency_source,
        forecast_horizon_s=(
            round(limits.forecast_horizon_s, 3)
            if math.isfinite(limits.forecast_horizon_s)
            else None
        ),
        halted=standing.halted,
    )
    return plan, chosen


class _Context:
    """What every ``Why`` of one filesystem's plan shares, worked out once per plan: a plan
    of 10,000 deletions makes 10,000 of them."""

    def __init__(
        self, standing: Standing, dir_excess: Mapping[str, int], rung: str = "delete"
    ) -> None:
        limits = standing.limits
        usage = standing.usage
        capacity = usage.used_bytes + usage.available_bytes
        predicted = None
        trigger = MEASURED
        if standing.predicted_only:
            trigger = PREDICTED
            predicted = (
                round(100.0 * standing.predicted_used_bytes / capacity, 3) if capacity else 0.0
            )
        #: ``Why``'s leading fields for the usage-percent rule, and for a log dir's budget.
        self._disk = (
            DISK_USAGE,
            trigger,
            limits.limit_percent,
            limits.target_percent,
            round(usage.usage_percent, 3),
            standing.excess_bytes,
        )
        self._bytes = (MAX_BYTES, MAX_BYTES, *self._disk[2:5])
        self._predicted = predicted
        self._max_bytes = limits.max_bytes
        self._dir_excess = dir_excess
        self._rung = rung
        self.mount = usage.mount

    def why(self, rule: str, rank: int, key: HeadKey, following: HeadKey | None) -> Why:
        """``key``'s Why: chosen by ``rule`` at ``rank``, before ``following``."""
        tie = None if following is None else tie_breaker(key, following)
        before = None if following is None else following.name
        if rule == MAX_BYTES:
            excess = self._dir_excess.get(key.log_dir, 0)
            more = (excess, rank, self._max_bytes, None, tie, before, self._rung)
            why: Why = new_named(Why, self._bytes + more)
        else:
            why = new_named(
                Why, (*self._disk, rank, None, self._predicted, tie, before, self._rung)
            )
        return why


def _walk(
    queue: HeadQueue,
    excess: int,
    log_dir_excess: dict[str, int],
    context: _Context,
    chosen: list[Deletion],
    trace: _FsTrace | None = None,
) -> int:
    """Pop heads oldest first into ``chosen`` until the filesystem's excess and every log
    dir's are covered; returns the filesystem's excess left (``log_dir_excess`` is updated).

    A chosen head becomes its ``Deletion`` once the next head is popped (the one after the
    last is popped too, without reading anything): its ``Why`` says what placed it first.
    ``trace``: filled with each deletion's head and the one after it, and every head popped
    while an equally old one was queued (``with_facts``)."""
    mount = context.mount
    rank = 0
    held: tuple[Head, str, int] | None = None  # chosen, waiting for the next key
    ties = trace.tied if trace is not None else None
    # Partitions dropped (their log dir needs nothing): a queue that dates ahead may still
    # offer their next heads, which one heap never would.
    dropped: set[str] = set()
    while excess > 0 or any(v > 0 for v in log_dir_excess.values()):
        popped = queue.pop()
        if popped is None:
            break
        if ties is not None and queue.tied:
            ties.append(popped)
        if popped[2].path in dropped:
            continue
        rank += 1
        if held is not None:
            chosen.append(_deletion(held, popped[0], mount, context))
            if trace is not None:
                trace.pairs.append((held[0], popped))
            held = None
        key, _index, _part, info, _next_offset, _groups = popped
        log_dir_path = key[6]
        dir_need = log_dir_excess.get(log_dir_path, 0)
        if excess <= 0 and dir_need <= 0:
            # Neither this filesystem nor this log dir needs bytes: drop the partition.
            dropped.add(popped[2].path)
            continue
        held = (popped, DISK_USAGE if excess > 0 else MAX_BYTES, rank)
        size = info.bytes
        excess -= size
        if log_dir_path in log_dir_excess:
            log_dir_excess[log_dir_path] -= size
        queue.advance(popped)
    if held is not None:
        following = queue.pop()
        while following is not None:
            if ties is not None and queue.tied:
                ties.append(following)
            if following[2].path not in dropped:
                break
            following = queue.pop()
        chosen.append(_deletion(held, following[0] if following else None, mount, context))
        if trace is not None:
            trace.pairs.append((held[0], following))
    return excess


#: How the hot paths make a ``Deletion``: a frozen dataclass's ``__init__`` sets each of its
#: 17 fields through ``object.__setattr__`` (~3 µs; ``dataclasses.replace`` ~5 µs), and a
#: plan makes 10,000 of them (broker mode twice, then each again with its placement). These
#: fill the new instance's dict with every field instead (~1 µs): the same object
#: (``tests/retention/test_planner_deletion.py`` holds them to the constructor's).
_new_instance = object.__new__


def _deletion(
    held: tuple[Head, str, int], following: HeadKey | None, mount: str, context: _Context
) -> Deletion:
    (key, _index, _part, info, next_offset, groups), reason, rank = held
    max_timestamp_ms, _unc, _led, topic, partition, base_offset, log_dir_path = key
    made: Deletion = _new_instance(Deletion)
    made.__dict__.update(
        log_dir=log_dir_path,
        topic=topic,
        partition=partition,
        base_offset=base_offset,
        next_offset=next_offset,
        max_timestamp_ms=max_timestamp_ms,
        bytes=info.bytes,
        files=info.files,
        mount=mount,
        timestamp_source=info.timestamp_source,
        reason=reason,
        unconsumed_records=(unconsumed_records(groups, base_offset, next_offset) if groups else {}),
        groups_without_offset=groups_without_offset(groups) if groups else (),
        why=context.why(reason, rank, key, following),
        leader=None,
        replicas=(),
        also_trims=(),
    )
    return made


def placed(
    deletion: Deletion, leader: int | None, replicas: tuple[int, ...], also_trims: tuple[int, ...]
) -> Deletion:
    """``deletion`` with its partition's leader and replicas, and the other brokers whose
    replicas its trim shortens (``replace``, the hot path's way)."""
    made: Deletion = _new_instance(Deletion)
    made.__dict__.update(deletion.__dict__, leader=leader, replicas=replicas, also_trims=also_trims)
    return made


def oldest_covering(
    fs: Filesystem,
    standing: Standing,
    read: SegmentReader,
    rung: str,
    heads: HeadsFactory = LocalHeads,
) -> list[Deletion]:
    """The global-oldest prefix set of ``fs``'s candidates whose bytes cover the standing's
    excess, by the same walk as a plan, each with its ``Why`` naming ``rung`` (the ladder's
    tiered rung walks uploaded segments with it)."""
    chosen: list[Deletion] = []
    if standing.excess_bytes <= 0 or standing.halted:
        return chosen
    queue = heads([p for d in fs.log_dirs for p in d.partitions], read, {}, None)
    try:
        _walk(queue, standing.excess_bytes, {}, _Context(standing, {}, rung), chosen)
    finally:
        queue.close()
    return chosen


def _consumers_offsets(
    fs: Filesystem, committed: CommittedOffsets | None
) -> dict[tuple[str, int], dict[str, int]]:
    if not committed:
        return {}
    keys = ((p.topic, p.partition) for d in fs.log_dirs for p in d.partitions)
    return with_missing_offsets(committed, keys)


def _head(
    part: Partition,
    index: int,
    read: SegmentReader,
    committed: CommittedOffsets,
    led_here: Collection[tuple[str, int]] | None = None,
) -> Head | None:
    if part.protected:
        return None
    candidate = part.candidate(index)
    if candidate is None:
        return None
    base, nxt = candidate
    info = read(part, base)
    if info.shared_files:
        return None  # frees nothing: kept, and nothing after it may go (prefix)
    groups = committed.get((part.topic, part.partition)) if committed else None
    key: HeadKey = new_named(
        HeadKey,
        (
            info.max_timestamp_ms,
            any(offset < nxt for offset in groups.values()) if groups else False,
            led_here is not None and (part.topic, part.partition) not in led_here,
            part.topic,
            part.partition,
            base,
            part.log_dir,
        ),
    )
    return key, index, part, info, nxt, groups


def plan(
    filesystems: Sequence[Filesystem],
    standing_of: Callable[[Filesystem], Standing],
    read: SegmentReader,
    committed: CommittedOffsets | None = None,
    led_here: Collection[tuple[str, int]] | None = None,
    heads: HeadsFactory = LocalHeads,
    covered: Mapping[str, int] | None = None,
    trace: WalkTrace | None = None,
) -> Plan:
    """Plan every filesystem; deletions are in deletion order (per filesystem, oldest first).
    ``standing_of``: each filesystem against its limits (``limits.stand``: over? by how much,
    net of what pending?), as the edge that knows the config and the pending bytes says.
    ``heads``: how each filesystem's partition heads are queued (and where they are dated).
    ``covered``: mount -> bytes of the excess the lossless rungs free first (``ladder``):
    deletion is for what is left. ``trace``: filled with what ``with_facts`` needs."""
    fs_plans: list[FilesystemPlan] = []
    deletions: list[Deletion] = []
    for fs in filesystems:
        fs_plan, chosen = _plan_filesystem(
            fs,
            standing_of(fs),
            read,
            committed,
            led_here,
            heads,
            (covered or {}).get(fs.usage.mount, 0),
            trace,
        )
        fs_plans.append(fs_plan)
        deletions.extend(chosen)
    not_live = tuple(d for fs in filesystems for log_dir in fs.log_dirs for d in log_dir.not_live)
    return Plan(tuple(fs_plans), tuple(deletions), protected_topics(filesystems), not_live)


class _FsTrace:
    """One filesystem's walk, as ``with_facts`` needs it (``WalkTrace``)."""

    __slots__ = ("context", "covered", "fs", "pairs", "standing", "tied")

    def __init__(self, fs: Filesystem, standing: Standing, covered: int, context: _Context) -> None:
        self.fs = fs
        self.standing = standing
        self.covered = covered
        self.context = context
        #: Per deletion, in order: its head and the head popped after it (None: none left).
        self.pairs: list[tuple[Head, Head | None]] = []
        #: Every head popped while another as old was queued.
        self.tied: list[Head] = []


class WalkTrace:
    """What a plan's walk saw besides what it chose (``plan(..., trace=)``): per filesystem,
    its standing, each deletion's head and the head after it, and the heads that had a rival
    as old when popped. Enough for ``with_facts`` to give the plan the broker's facts
    without walking again."""

    def __init__(self) -> None:
        self.filesystems: dict[str, _FsTrace] = {}


def with_facts(
    chosen: Plan,
    trace: WalkTrace,
    standing_of: Callable[[Filesystem], Standing],
    committed: CommittedOffsets | None,
    led_here: Collection[tuple[str, int]] | None,
    covered: Mapping[str, int] | None = None,
) -> Plan | None:
    """``chosen`` (planned knowing no consumer offsets and no leaders, with ``trace``) as the
    plan of the same filesystems knowing them would be; None where that plan could differ.

    Why it is the same plan: the facts change only the key's ``unconsumed`` and
    ``led_elsewhere`` (both False in the walk traced), and both come after the largest
    timestamp. So a head popped with no rival as old is popped first knowing the facts too;
    one that had a rival is still first if its own facts are both False (its rival can only
    tie with it or come after by name, as before). Then every pop is the same, so every
    deletion, rank and following head; what changes is each deletion's unconsumed records and
    its ``Why`` (the keys it names differ). None (walk again) when a tied head has a fact set,
    or a filesystem's standing or lossless cover changed since the traced walk."""
    out: list[Deletion] = []
    for fs_trace in trace.filesystems.values():
        fs = fs_trace.fs
        if (
            standing_of(fs) != fs_trace.standing
            or (covered or {}).get(fs.usage.mount, 0) != fs_trace.covered
        ):
            return None
        facts_of = _Facts(_consumers_offsets(fs, committed), led_here)
        for head in fs_trace.tied:
            if facts_of.head(head) != (False, False):
                return None
        context = fs_trace.context
        for (head, following), was in zip(
            fs_trace.pairs, chosen.deletions[len(out) : len(out) + len(fs_trace.pairs)], strict=True
        ):
            facts = facts_of.head(head)
            after_facts = (False, False) if following is None else facts_of.head(following)
            groups, least, _led = facts_of.of(was.topic, was.partition)
            if least is not None and least < was.next_offset:
                unconsumed = unconsumed_records(groups or {}, was.base_offset, was.next_offset)
                without = groups_without_offset(groups or {})
            else:  # every group is past the segment (so none lacks an offset): nothing
                unconsumed, without = {}, ()
            if not (facts[0] or facts[1] or unconsumed or without) and not (
                after_facts[0] or after_facts[1]
            ):
                out.append(was)  # keys as walked, nothing unconsumed: the same deletion
                continue
            assert was.why is not None  # a walk's deletion says why
            key = _with_facts(head[0], facts)
            after = None if following is None else _with_facts(following[0], after_facts)
            made: Deletion = _new_instance(Deletion)
            made.__dict__.update(
                was.__dict__,
                unconsumed_records=unconsumed,
                groups_without_offset=without,
                why=context.why(was.reason, was.why.rank, key, after),
            )
            out.append(made)
    if len(out) != len(chosen.deletions):
        return None
    return replace(chosen, deletions=tuple(out))


class _Facts:
    """The broker's facts per partition for ``with_facts``, worked out once each (a plan
    of 10,000 deletions asked for 20,000 keys, ~10 per partition): its groups' committed
    offsets (``_consumers_offsets``) and the least of them, and whether another broker
    leads it."""

    def __init__(
        self, groups_of: CommittedOffsets, led_here: Collection[tuple[str, int]] | None
    ) -> None:
        self._groups_of = groups_of
        self._led_here = led_here
        self._known: dict[tuple[str, int], tuple[Mapping[str, int] | None, int | None, bool]] = {}

    def of(self, topic: str, partition: int) -> tuple[Mapping[str, int] | None, int | None, bool]:
        """``(groups, least offset of them or None, led elsewhere)`` of a partition."""
        name = (topic, partition)
        known = self._known.get(name)
        if known is None:
            groups = self._groups_of.get(name) if self._groups_of else None
            known = self._known[name] = (
                groups,
                min(groups.values()) if groups else None,
                self._led_here is not None and name not in self._led_here,
            )
        return known

    def head(self, head: Head) -> tuple[bool, bool]:
        """``head``'s key fields ``(unconsumed, led_elsewhere)`` had it been made knowing
        the facts, as ``_head`` makes them: some group's offset below its next offset."""
        key, _index, _part, _info, nxt, _groups = head
        _g, least, led_elsewhere = self.of(key[3], key[4])
        return least is not None and least < nxt, led_elsewhere


def _with_facts(key: HeadKey, facts: tuple[bool, bool]) -> HeadKey:
    """``key`` with ``_facts_of``'s fields (the walk traced made it knowing neither)."""
    if facts == (key[1], key[2]):
        return key
    return new_named(HeadKey, (key[0], *facts, *key[3:]))


def protected_topics(filesystems: Sequence[Filesystem]) -> tuple[ProtectedTopic, ...]:
    """One entry per protected topic; partitions protected for different reasons (one of
    them tiered, say) give the distinct reasons joined by "; "."""
    reasons: dict[str, list[str]] = {}
    for fs in filesystems:
        for log_dir in fs.log_dirs:
            for part in log_dir.partitions:
                if not part.protected:
                    continue
                why = part.protected_reason or "protected"
                seen = reasons.setdefault(part.topic, [])
                if why not in seen:
                    seen.append(why)
    return tuple(
        ProtectedTopic(topic, "; ".join(sorted(whys))) for topic, whys in sorted(reasons.items())
    )
