"""The aggregation job on a real Spark standalone cluster (one master, one worker).

The master and the worker are started from the installed pyspark (`spark-class`), bound to
loopback with free ports; the job is submitted unchanged with ``spark-submit --master
spark://…`` exactly as docs/aggregate.md says (package shipped with ``--py-files``), and its
outputs are compared with a local-mode run of ``diskguard aggregate`` on the same input.
This is what proves the cluster path: executors in a separate JVM (and separate Python
workers) on a different process tree than the driver.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark
import pytest

from support.fleetgen import make_fleet, write_spool
from support.net import free_port

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
DEADLINE_S = 120.0  # the worker's registration
STEP_TIMEOUT_S = 240.0  # each job run; ~30-45 s on an idle 2-core machine


def _spark_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_MASTER_HOST="127.0.0.1",
        SPARK_LOG_DIR=str(tmp / "logs"),
        SPARK_WORKER_DIR=str(tmp / "work"),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    # spark-submit must not inherit the test's PYTHONPATH: the driver gets the package only
    # from --py-files, as on a real cluster node.
    env.pop("PYTHONPATH", None)
    return env


def _alive_workers(webui: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except (OSError, ValueError):
        # Not up yet: refused, or (seen once in CI) an empty body while the master starts.
        return 0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A standalone master + one worker (1 core, 1 GiB) on 127.0.0.1; yields (url, env)."""
    tmp = tmp_path_factory.mktemp("spark-cluster")
    env = _spark_env(tmp)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, webui, wport, wwebui = (free_port() for _ in range(4))
    url = f"spark://127.0.0.1:{port}"
    master_log = (tmp / "master.log").open("wb")
    worker_log = (tmp / "worker.log").open("wb")
    master = subprocess.Popen(
        [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(webui),
        ],
        env=env,
        stdout=master_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    worker = subprocess.Popen(
        [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--port",
            str(wport),
            "--webui-port",
            str(wwebui),
            "--cores",
            "1",
            "--memory",
            "1g",
            "--work-dir",
            str(tmp / "work"),
            url,
        ],
        env=env,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while _alive_workers(webui) < 1:
            for name, p in (("master", master), ("worker", worker)):
                if p.poll() is not None:
                    log = (tmp / f"{name}.log").read_text(errors="replace")[-3000:]
                    pytest.fail(f"spark {name} exited {p.returncode}:\n{log}")
            if time.monotonic() > deadline:
                logs = "".join(
                    (tmp / f"{n}.log").read_text(errors="replace")[-2000:]
                    for n in ("master", "worker")
                )
                pytest.fail(f"no worker registered with {url} in {DEADLINE_S:.0f}s:\n{logs}")
            time.sleep(0.5)
        yield url, env
    finally:
        _stop(worker)
        _stop(master)
        master_log.close()
        worker_log.close()


def _package_zip(path: Path) -> Path:
    """daemon/diskguard zipped, as docs/aggregate.md ships it with --py-files."""
    with zipfile.ZipFile(path, "w") as z:
        for f in sorted((REPO / "daemon" / "diskguard").rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                z.write(f, f.relative_to(REPO / "daemon"))
    return path


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
    cluster: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, env = cluster
    spool = tmp_path / "spool"
    write_spool(spool, make_fleet().lines)
    pyfiles = _package_zip(tmp_path / "diskguard.zip")
    # The job file is copied out of the source tree so that nothing but --py-files can
    # provide the package to the driver (a script's own directory is on sys.path).
    job = tmp_path / "job" / "sparkjob.py"
    job.parent.mkdir()
    shutil.copy(REPO / "daemon" / "diskguard" / "sparkjob.py", job)

    submitted = _run(
        [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--master",
            url,
            "--py-files",
            str(pyfiles),
            "--executor-memory",
            "512m",
            "--total-executor-cores",
            "1",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=4",  # as local mode; 600 rows need no 200 tasks
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            str(job),
            "--input",
            str(spool),
            "--output",
            str(tmp_path / "cluster"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )
    assert submitted.returncode == 0, submitted.stderr[-4000:]
    # It really ran on the cluster: the worker launched an executor for it.
    assert list((Path(env["SPARK_WORKER_DIR"])).glob("app-*/*/stderr")), "no executor ran"

    local_env = dict(os.environ, PYTHONPATH=str(REPO / "daemon"))
    local = _run(
        [
            sys.executable,
            "-m",
            "diskguard",
            "aggregate",
            "--master",
            "local[2]",
            "--input",
            str(spool),
            "--output",
            str(tmp_path / "local"),
        ],
        env=local_env,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )
    assert local.returncode == 0, local.stderr[-4000:]
    # The summary line (counts) is the same.
    assert submitted.stdout.splitlines()[0] == local.stdout.splitlines()[0]
    assert "from 3 hosts, 5 disks" in local.stdout

    for name in ("disks", "topics", "hosts"):
        cluster_rows = _table(tmp_path / "cluster" / f"{name}.parquet", name)
        assert cluster_rows, name
        _same(cluster_rows, _table(tmp_path / "local" / f"{name}.parquet", name), name)
    summaries = [
        json.loads((tmp_path / run / "summary.json").read_text()) for run in ("cluster", "local")
    ]
    for s in summaries:
        s.pop("generated_at")
    _same(summaries[0], summaries[1], "summary.json")
