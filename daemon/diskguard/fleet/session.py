"""The Spark session the job runs in, and Spark's failures and chatter made readable.

``build_session`` sets the job's options (UTC, adaptive execution, few shuffle partitions in
local mode); the driver JVM starts with a private log4j config and a stderr that drops its
start-up banners, and locally with the parallel GC and the class archive of
:mod:`diskguard.fleet.classarchive` (``stop_session`` makes it on the first run).
``spark_errors`` turns pages of JVM stack trace into one line.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

from diskguard.errors import FailedError
from diskguard.fleet import classarchive
from diskguard.fleet.kafkasource import ERROR_PREFIX, KafkaSourceError

DEFAULT_MASTER = "local[*]"
LOCAL_JAVA_OPTIONS = "-XX:+UseParallelGC -XX:CompileThresholdScaling=10"


class SparkJobError(FailedError):
    """Spark itself failed (unreadable input, executor lost, ...): one line, exit 1."""


@contextmanager
def spark_errors() -> Iterator[None]:
    """Turn JVM-wrapped failures (pages of stack trace) into one line.

    A Kafka source failure comes back as its own message (KafkaSourceError); anything else
    from Spark becomes SparkJobError carrying the first line that names an exception.
    """
    try:
        yield
    except Exception as exc:
        if not type(exc).__module__.startswith(("py4j", "pyspark")):
            raise
        text = str(exc)
        match = re.search(re.escape(ERROR_PREFIX) + r"([^\n]*)", text)
        if match:
            raise KafkaSourceError(match.group(1).strip()) from None
        raise SparkJobError(condense_error(text)) from None


def condense_error(text: str) -> str:
    """The most telling line of a Spark/Py4J error message, at most 300 characters."""
    lines = [line.strip().lstrip(": ") for line in text.splitlines() if line.strip()]
    telling = [
        line
        for line in lines
        if re.search(r"(Exception|Error)\b.*:", line) and not line.startswith("at ")
    ]
    best = telling[0] if telling else (lines[0] if lines else "Spark failed")
    return best if len(best) <= 300 else best[:297] + "..."


_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.strutils.name = org.apache.spark.sql.catalyst.util.SparkStringUtils
logger.strutils.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.sink.name = org.apache.spark.sql.execution.streaming.FileStreamSink
logger.sink.level = error
"""

_JVM_NOISE = (
    "WARNING: Using incubator modules",
    "Using Spark's default log4j profile",
    "Setting default log level to",
    "To adjust logging level use sc.setLogLevel",
    "Dynamic dump to file",  # the class archive's dump (classarchive), on the JVM's stdout
)
# Sessions whose JVM records its classes for the archive: stop_session dumps them.
_ARCHIVE_PENDING: dict[int, Path] = {}


def _forward_filtered(read_fd: int, write_fd: int) -> None:
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.decode("utf-8", "replace").lstrip().startswith(_JVM_NOISE):
                    os.write(write_fd, line + b"\n")
        if pending:
            os.write(write_fd, pending)


@contextmanager
def _jvm_stderr_filtered(stdout_too: bool = False) -> Iterator[None]:
    """Start the JVM with a stderr that drops its start-up chatter and passes the rest on.

    The JVM inherits fd 2 when it is forked, so fd 2 is swapped for a pipe only around the
    launch; a daemon thread forwards every line except the known banners to the real stderr.
    ``stdout_too`` sends the JVM's stdout there as well (a JVM that will dump its class
    archive prints a line on stdout, which belongs to the command's own output).
    """
    try:
        real = os.dup(2)
        real_out = os.dup(1) if stdout_too else None
    except OSError:
        yield
        return
    read_fd, write_fd = os.pipe()
    sys.stderr.flush()
    sys.stdout.flush()
    os.dup2(write_fd, 2)
    if real_out is not None:
        os.dup2(write_fd, 1)
    os.close(write_fd)
    threading.Thread(target=_forward_filtered, args=(read_fd, real), daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)
        if real_out is not None:
            sys.stdout.flush()
            os.dup2(real_out, 1)
            os.close(real_out)


@contextmanager
def private_log4j_config() -> Iterator[Path]:
    """The log4j2 file for one JVM launch, in a fresh private directory removed afterwards.

    Not a fixed path under /tmp: two runs (two users, or two concurrent jobs) would share and
    rewrite one file, and another local user could plant a config there first (log4j2
    configs can name appenders that write anywhere). ``mkdtemp`` makes a 0700 directory; the
    file is created 0600 inside it. Log4j reads the file while the driver JVM starts, which
    is over when ``getOrCreate`` returns, so the directory goes at the end of this block.
    """
    directory = tempfile.mkdtemp(prefix="diskguard-spark-log4j-")
    try:
        path = Path(directory) / "log4j2.properties"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_LOG4J)
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def build_session(
    master: str | None = DEFAULT_MASTER,
    app_name: str = "diskguard-aggregate",
    quiet: bool = True,
    driver_memory: str = "4g",
) -> SparkSession:
    """A SparkSession with the job's settings: UTC, WARN logs, few shuffle partitions locally.

    ``master=None`` keeps whatever spark-submit chose. Local mode also pins the Python
    workers to this interpreter (so they see the same packages) and binds to loopback.
    """
    launched_by_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        # Spark's own stage progress bar on a terminal, nothing in logs and pipes.
        .config("spark.ui.showConsoleProgress", "true" if sys.stderr.isatty() else "false")
        .config("spark.sql.adaptive.enabled", "true")
        # The fold caches the new unique snapshots (and a full recompute its day rows);
        # without this, adaptive execution leaves a cached plan's partitions as they are:
        # on a cluster's 200 shuffle partitions one day became 200 tasks per step and up
        # to 200 small files per table and day. Coalesced, they follow the data's size.
        .config("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning", "true")
        .config("spark.sql.debug.maxToStringFields", "200")
        # An aggregation whose input is already sorted by its keys streams through it: the
        # disk-day rows come out of the dedup window sorted by disk-day, and their
        # aggregation (collect_list: an object hash aggregation, never generated code)
        # would otherwise sort them again once a task holds more than 128 disk-days.
        .config("spark.sql.execution.replaceHashWithSortAgg", "true")
    )
    local = (master or "").startswith("local")
    if local:
        builder = (
            builder.config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", "4")
            .config("spark.ui.enabled", "false")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.pyspark.driver.python", sys.executable)
        )
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if not launched_by_spark_submit:
            builder = builder.config("spark.driver.memory", driver_memory)
    java_options = []
    archive, record = None, False
    if local and not launched_by_spark_submit:
        # The local job is one short batch in one JVM: the throughput collector costs less
        # CPU than G1's concurrent work and write barriers; and a run over one new day
        # spent ~40 % of its CPU JIT-compiling Spark's own code, of which scaled-up
        # compile thresholds save about a third (see docs/benchmarks.md).
        java_options.append(LOCAL_JAVA_OPTIONS)
        if quiet:
            archive = classarchive.archive_path()
            archive_options, record = classarchive.java_options(archive)
            java_options += archive_options
    if quiet and not launched_by_spark_submit:
        with private_log4j_config() as log4j:
            java_options.append(f"-Dlog4j.configurationFile=file:{log4j}")
            builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options))
            with _jvm_stderr_filtered(stdout_too=record):
                spark = builder.getOrCreate()
        if record and archive is not None:
            _ARCHIVE_PENDING[id(spark)] = archive
    else:
        if java_options:
            builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options))
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop the session; a JVM recording its classes first dumps the archive (once ever)."""
    archive = _ARCHIVE_PENDING.pop(id(spark), None)
    if archive is not None:
        classarchive.dump(spark, archive)
    spark.stop()
