"""A real Spark standalone cluster (one master, one worker) on 127.0.0.1, free ports.

Started from the installed pyspark's own launchers (``spark-class``), as docs/aggregate.md
shows; the job goes to it unchanged with ``spark-submit --py-files`` (:func:`submit`). Used
by the cluster test and by ``bench/bench_incremental.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from support.net import free_port

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent


class ClusterError(RuntimeError):
    """The master or the worker did not come up; the message carries their logs' tails."""


@dataclass(frozen=True)
class Standalone:
    url: str
    env: dict[str, str]  # for spark-submit: SPARK_HOME, loopback, no PYTHONPATH
    work_dir: Path  # the worker's: app-*/<executor>/stderr once an executor ran


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


@contextmanager
def standalone(
    tmp: Path, cores: int = 1, memory: str = "1g", deadline_s: float = 120.0
) -> Iterator[Standalone]:
    """A master and one worker (``cores``, ``memory``) until the block ends."""
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
    # spark-submit must not inherit a PYTHONPATH: the driver gets the package only from
    # --py-files, as on a real cluster node.
    env.pop("PYTHONPATH", None)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, webui, wport, wwebui = (free_port() for _ in range(4))
    url = f"spark://127.0.0.1:{port}"
    logs = {name: (tmp / f"{name}.log").open("wb") for name in ("master", "worker")}
    roles = {
        "master": [
            "org.apache.spark.deploy.master.Master",
            *("--port", str(port), "--webui-port", str(webui)),
        ],
        "worker": [
            "org.apache.spark.deploy.worker.Worker",
            *("--port", str(wport), "--webui-port", str(wwebui)),
            *("--cores", str(cores), "--memory", memory),
            *("--work-dir", str(tmp / "work"), url),
        ],
    }
    procs = {
        name: subprocess.Popen(
            [spark_class, args[0], "--host", "127.0.0.1", *args[1:]],
            env=env,
            stdout=logs[name],
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for name, args in roles.items()
    }

    def tails(size: int) -> str:
        return "".join(
            (tmp / f"{n}.log").read_text(errors="replace")[-size:] for n in ("master", "worker")
        )

    try:
        deadline = time.monotonic() + deadline_s
        while _alive_workers(webui) < 1:
            for name, p in procs.items():
                if p.poll() is not None:
                    raise ClusterError(f"spark {name} exited {p.returncode}:\n{tails(3000)}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"no worker registered with {url} in {deadline_s:.0f}s:\n{tails(2000)}"
                )
            time.sleep(0.5)
        yield Standalone(url, env, tmp / "work")
    finally:
        _stop(procs["worker"])
        _stop(procs["master"])
        for f in logs.values():
            f.close()


def package_zip(path: Path, daemon: Path = REPO / "daemon") -> Path:
    """daemon/diskguard zipped, as docs/aggregate.md ships it with --py-files."""
    with zipfile.ZipFile(path, "w") as z:
        for f in sorted((daemon / "diskguard").rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                z.write(f, f.relative_to(daemon))
    return path


def submit(
    cluster: Standalone,
    tmp: Path,
    cores: int = 1,
    executor_memory: str = "512m",
    driver_memory: str = "1g",
    conf: dict[str, str] | None = None,
    daemon: Path = REPO / "daemon",
) -> list[str]:
    """The spark-submit command of the fleet job on ``cluster``; its arguments follow.

    The job file is copied out of the source tree so that nothing but --py-files can
    provide the package to the driver (a script's own directory is on sys.path).
    ``daemon``: the tree whose package is shipped (a benchmark's baseline).
    """
    pyfiles = package_zip(tmp / "diskguard.zip", daemon)
    job = tmp / "job" / "sparkjob.py"
    job.parent.mkdir(exist_ok=True)
    shutil.copy(daemon / "diskguard" / "sparkjob.py", job)
    settings = {
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.pyspark.python": sys.executable,
        **(conf or {}),
    }
    command = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        *("--master", cluster.url, "--py-files", str(pyfiles)),
        *("--driver-memory", driver_memory, "--executor-memory", executor_memory),
        *("--total-executor-cores", str(cores)),
    ]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, str(job)]
