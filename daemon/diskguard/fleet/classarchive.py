"""A class-data-sharing archive of the local Spark JVM's classes: a faster start.

A local run loads and verifies some 20,000 classes from Spark's jars before its first
query, and much of its fixed CPU cost is that (docs/benchmarks.md: about 11 s less CPU and
a few seconds less wall time per 1M-row run with the archive). The first local run records
what it loaded and, once its outputs are written, has its own JVM dump them (``jcmd ...
VM.cds dynamic_dump``, JDK 17+) to a temporary name that is then renamed into place, so a
concurrent run never maps a partial file; later runs start from it. The archive lives in
the user's cache directory, named after the Java binary and the PySpark install it was made
with (another JVM or Spark makes another archive). Without jcmd, or a writable cache
directory, a run simply goes without; a new archive removes those of other installs (an
upgraded JVM or PySpark), so one stays, and a run that maps it removes the partial dumps of
runs killed while dumping. Deleting the directory is always safe. Only local
mode, and only when diskguard launches the JVM itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

# -Xlog: the JVM's CDS notes (classes it cannot archive, ...) would otherwise go to stdout.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
DUMP_TIMEOUT_S = 120


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.isfile(found) else None


def archive_path() -> Path | None:
    """Where this Java + PySpark pair's archive is (or would be); None without a java."""
    java = _java()
    if java is None:
        return None
    try:
        key = f"{java}\0{os.path.getmtime(java)}\0{pyspark.__file__}\0{pyspark.__version__}"
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    except (OSError, RuntimeError):  # no home directory to be found
        return None
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(cache) / "diskguard" / f"spark-classes-{digest}.jsa"


def java_options(path: Path | None) -> tuple[list[str], bool]:
    """The JVM options for ``path``, and whether this run should dump the archive."""
    if path is None or any(c.isspace() or c in "'\"\\" for c in str(path)):
        # spark.driver.extraJavaOptions is one string split like a shell line: a cache dir
        # with a space (or quote) in its path would break the JVM's command line.
        return [], False
    if path.is_file():
        remove_abandoned(path.parent)
        return [f"-XX:SharedArchiveFile={path}", *_QUIET.split()], False
    if shutil.which("jcmd", path=os.path.dirname(_java() or "")) is None:
        return [], False
    return ["-XX:+RecordDynamicDumpInfo", *_QUIET.split()], True


def dump(spark: SparkSession, path: Path) -> None:
    """Have the running driver JVM write its loaded classes to ``path`` (best effort)."""
    jcmd = shutil.which("jcmd", path=os.path.dirname(_java() or ""))
    if jcmd is None or path.exists():
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        done = subprocess.run(
            [jcmd, str(pid), "VM.cds", "dynamic_dump", str(partial)],
            capture_output=True,
            timeout=DUMP_TIMEOUT_S,
            check=False,
        )
        if done.returncode == 0 and partial.is_file() and partial.stat().st_size > 0:
            os.replace(partial, path)
            remove_stale(path)
        else:
            partial.unlink(missing_ok=True)
    except (OSError, subprocess.SubprocessError):
        with contextlib.suppress(OSError):  # a dump that timed out leaves no partial file
            partial.unlink(missing_ok=True)


def remove_stale(current: Path) -> int:
    """Remove the archives of other Java/PySpark installs beside ``current`` (an upgrade
    makes a new one; each is ~130 MB of somebody's home directory); the number removed.
    Partial dumps of other runs are left alone: they may be in progress."""
    removed = 0
    for other in current.parent.glob("spark-classes-*.jsa"):
        if other.name != current.name:
            with contextlib.suppress(OSError):
                other.unlink()
                removed += 1
    return removed


def remove_abandoned(directory: Path, now: float | None = None) -> int:
    """Remove the partial dumps of runs that died mid-dump (killed, out of memory); the
    number removed. Each is ~130 MB, and nothing else would ever remove it: a partial is
    named after the process that writes it, and is abandoned once that process is gone and
    the file is older than a dump may take (a run unlinks its own partial by then)."""
    removed = 0
    limit = (time.time() if now is None else now) - DUMP_TIMEOUT_S
    for partial in directory.glob("spark-classes-*.jsa.*.tmp"):
        pid = partial.name.removesuffix(".tmp").rsplit(".", 1)[-1]
        with contextlib.suppress(OSError, ValueError):
            if partial.stat().st_mtime < limit and not _alive(int(pid)):
                partial.unlink()
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
