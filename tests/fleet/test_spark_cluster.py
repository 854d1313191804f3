"""The aggregation job on a real Spark standalone cluster (one master, one worker).

The master and the worker are started from the installed pyspark (`spark-class`), bound to
loopback with free ports; the job is submitted unchanged with ``spark-submit --master
spark://…`` exactly as docs/aggregate.md says (package shipped with ``--py-files``), and its
outputs are compared with a local-mode run of the same job on the same input (in this
process's local session), and so are those of a cluster run that folds the second half of it
into daily summaries a local run made of the first half: the cluster's executors read the
summaries and write the days it changes. This is what proves the cluster path: executors in
a separate JVM (and separate Python workers) on a different process tree than the driver.
Two submits, each a driver and an executor JVM: the suite's time is counted.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from diskguard.fleet.inputs import resolve_input
from diskguard.fleet.job import run_aggregation
from support.fleetgen import make_fleet, write_spool
from support.sparkcluster import ClusterError, Standalone, standalone, submit

pytestmark = pytest.mark.spark

# each job run: ~30-45 s on an idle 2-core machine; at load 20 one took over 240 s
STEP_TIMEOUT_S = 600.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """A standalone master + one worker (1 core, 1 GiB) on 127.0.0.1."""
    try:
        with standalone(tmp_path_factory.mktemp("spark-cluster")) as running:
            yield running
    except ClusterError as exc:
        pytest.fail(str(exc))


KEYS = {"disks": ("host", "mount"), "topics": ("topic",), "hosts": ("host",)}


def _table(path: Path, name: str) -> list[dict[str, Any]]:
    rows = pq.read_table(path).to_pylist()
    return sorted(rows, key=lambda r: tuple(r[k] for k in KEYS[name]))


def _same(a: Any, b: Any, where: str) -> None:
    """Equal values; floats to 1e-9 relative (partials are summed in a different order)."""
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (where, a, b)
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), (where, sorted(a), sorted(b))
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), (where, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """subprocess.run, but a timeout is a test failure that shows the run's stderr."""
    try:
        return subprocess.run(cmd, **kwargs)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        pytest.fail(f"{cmd[0]} timed out after {exc.timeout:.0f}s:\n{err[-3000:]}")


def test_standalone_cluster_outputs_equal_local_mode(
    spark: Any, cluster: Standalone, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    lines = make_fleet().lines
    write_spool(spool, lines)
    # as local mode: 600 rows need no 200 tasks
    job = submit(cluster, tmp_path, conf={"spark.sql.shuffle.partitions": "4"})

    def on_cluster(*args: str) -> subprocess.CompletedProcess[str]:
        done = _run(
            [*job, *args],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return done

    submitted = on_cluster("--input", str(spool), "--output", str(tmp_path / "cluster"))
    # It really ran on the cluster: the worker launched an executor for it.
    assert list(cluster.work_dir.glob("app-*/*/stderr")), "no executor ran"

    local = run_aggregation(spark, resolve_input(str(spool)), tmp_path / "local")
    # The summary line (counts) is the one `diskguard aggregate` prints in local mode.
    assert submitted.stdout.splitlines()[0] == local.summary_line()
    assert "from 3 hosts, 5 disks" in local.summary_line()
    _assert_same_outputs(tmp_path / "cluster", tmp_path / "local")

    # Daily summaries of the first half (a local run), folded on by the cluster: its
    # executors read them and write the days the second half changes; the report is the
    # local full run's.
    halves = tmp_path / "halves"
    write_spool(halves / "a", lines[: len(lines) // 2], files=1)
    write_spool(halves / "b", lines[len(lines) // 2 :], files=1)
    summaries = tmp_path / "summaries"
    first = run_aggregation(
        spark, resolve_input(str(halves / "a")), tmp_path / "local-a", summaries=summaries
    )
    assert first.fold is not None and first.fold.days_changed > 0
    out = str(tmp_path / "cluster-b")
    folded = on_cluster(
        "--input", str(halves / "b"), "--output", out, "--summaries", str(summaries)
    )
    # the cluster read only the second half and changed days of the summaries
    assert re.search(
        r"this run read [1-9]\d* valid records from 1 new or changed files, "
        r"[1-9]\d* new snapshots into [1-9]\d* days",
        folded.stdout,
    ), folded.stdout
    _assert_same_outputs(tmp_path / "cluster-b", tmp_path / "local")


def _assert_same_outputs(a: Path, b: Path) -> None:
    for name in ("disks", "topics", "hosts"):
        rows = _table(a / f"{name}.parquet", name)
        assert rows, name
        _same(rows, _table(b / f"{name}.parquet", name), name)
    summaries = [json.loads((run / "summary.json").read_text()) for run in (a, b)]
    for s in summaries:
        for key in ("generated_at", "source", "summaries"):
            s.pop(key, None)
    _same(summaries[0], summaries[1], "summary.json")
