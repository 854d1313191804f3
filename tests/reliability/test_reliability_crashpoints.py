"""Reliability: ``kill -9`` of offline deletion at EVERY file-system operation, in turn.

For each scenario of ``crashpoints.SCENARIOS`` (several partitions, two log dirs on one
filesystem, a ``-delete`` dir in new and legacy names, ``*.deleted`` leftovers, ``-future`` and
``-stray`` dirs that must stay), strace kills ``diskguard enforce --once`` on entry of its N-th
``renameat``/``unlinkat``/``fsync``/``write``/``ftruncate``/``fallocate`` (every kind that
occurs), for N over every such call — the counting pass lists them — and a clean re-run must
converge to exactly the uninterrupted run's end state with a consistent audit log (rules in
``crashpoints``). Over 1,000 crash points in all; the driver forks pre-imported children, so
this takes about four minutes on two shared cores (no timing is asserted).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from support import crashpoints

#: Floors on each scenario's crash points (their trees give 331, 259, 560 and 69 today, with
#: deletions batched: a segment costs its renames and unlinks, the fsyncs are per batch): the
#: suite kills at >= 1,000 points in all, and a change that makes the executor skip calls (or
#: the counting miss them) fails here.
MIN_POINTS = {"sweep+segments": 330, "two-log-dirs": 255, "many-segments": 550, "sweep-only": 60}
assert sum(MIN_POINTS.values()) >= 1000


@pytest.mark.parametrize("name", list(crashpoints.SCENARIOS))
def test_every_crash_point_of_offline_deletion_converges(name: str, tmp_path: Path) -> None:
    crashpoints.require_strace()
    scenario = crashpoints.SCENARIOS[name]
    ref, results = crashpoints.run_scenario(scenario, tmp_path)
    # The scenario is what it says: leftovers swept; live segments only where needed.
    assert any(r.endswith("-delete") for r in ref.swept)
    assert any(r.endswith(".deleted") for r in ref.swept)
    if name == "sweep-only":
        assert not ref.gone_segments
    else:
        assert len(ref.gone_segments) >= 8
    kinds = Counter(r.syscall for r in results)
    assert kinds == Counter(ref.counts), "every counted call is one crash point"
    assert len(results) >= MIN_POINTS[name], len(results)
    assert {"unlinkat", "fsync", "write"} <= set(kinds)
    if ref.gone_segments:
        assert "renameat" in kinds
    bad = [r for r in results if r.problems]
    assert not bad, "\n".join(f"{r.syscall} #{r.n}: {'; '.join(r.problems)}" for r in bad[:10])
    assert all(r.killed for r in results)
    print(f"{name}: {len(results)} crash points survived: {dict(sorted(kinds.items()))}")


#: Crash points tried on loop ext4 (spread evenly over all of the scenario's): the whole
#: scenario there is bench/crashpoints.py --logs-fs ext4 (docs/reliability.md); this keeps
#: the one-fsync path under test in the suite at a fraction of the time.
EXT4_SAMPLE = 60


def test_crash_points_converge_where_the_batch_fsyncs_one_dir(tmp_path: Path) -> None:
    """On ext4 with its journal a batch fsyncs only the partition dir it changed last
    (``fsjournal.commits_in_order``): fewer fsyncs, so other crash points than on tmpfs.
    Two log dirs on one filesystem, so a batch changes several dirs."""
    crashpoints.require_strace()
    scenario = crashpoints.SCENARIOS["two-log-dirs"]
    ref, results = crashpoints.run_scenario(
        scenario,
        tmp_path,
        select=lambda points: crashpoints.sample_points(points, EXT4_SAMPLE),
        logs_fs="ext4",
    )
    assert ref.gone_segments and ref.swept
    assert len(results) == EXT4_SAMPLE
    assert {"renameat", "unlinkat", "fsync", "write"} <= {r.syscall for r in results}
    bad = [r for r in results if r.problems]
    assert not bad, "\n".join(f"{r.syscall} #{r.n}: {'; '.join(r.problems)}" for r in bad[:10])
    assert all(r.killed for r in results)
