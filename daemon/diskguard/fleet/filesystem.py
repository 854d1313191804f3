"""Small files and directories of the job's outputs, locally or through Hadoop's FileSystem.

The job writes its Parquet through Spark, wherever Spark can write; the small things around
it (summary.json, report.html, the summaries' manifest, listing and removing version
directories) go through this: plain file I/O for a local path, Hadoop's FileSystem (the one
Spark uses, with its configuration) for a URI such as hdfs:// or s3a://.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pyspark.sql import SparkSession

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_remote(location: str) -> bool:
    """A URI for Hadoop (hdfs://, s3a://, ...); ``file://`` and plain paths are local."""
    return bool(_URI.match(location)) and not location.startswith("file://")


def local_path(location: str) -> str:
    """A local location without its ``file://`` prefix, if it has one."""
    return location[len("file://") :] if location.startswith("file://") else location


def file_key(location: str) -> str:
    """One spelling per file: a local absolute path, or a remote URI, unescaped.

    Spark names the file a record came from as a URI (``file:/a/b%20c.jsonl``); the input
    listing names it as a path. Both become this, so that a file is known again.
    """
    if location.startswith("file:"):
        return unquote(urlsplit(location).path)
    if is_remote(location):
        return unquote(location)
    return os.path.abspath(location)


@dataclass(frozen=True)
class FileStat:
    """A file as listed: its key (:func:`file_key`), size and modification time (ms)."""

    path: str
    size: int
    mtime_ms: int


class Storage:
    """The operations the job needs on a directory tree, for one location's file system."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.remote = is_remote(location)
        self._spark = spark
        self._fs: Any = None
        if self.remote:
            jvm = spark.sparkContext._jvm
            assert jvm is not None
            self._jvm = jvm
            conf = spark.sparkContext._jsc.hadoopConfiguration()
            self._fs = jvm.org.apache.hadoop.fs.Path(location).getFileSystem(conf)

    def _path(self, location: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(location)

    def exists(self, location: str) -> bool:
        if not self.remote:
            return os.path.exists(local_path(location))
        return bool(self._fs.exists(self._path(location)))

    def listdir(self, location: str) -> list[str]:
        """Names in a directory (empty when it does not exist)."""
        if not self.remote:
            try:
                return sorted(os.listdir(local_path(location)))
            except FileNotFoundError:
                return []
        path = self._path(location)
        if not self._fs.exists(path):
            return []
        return sorted(str(s.getPath().getName()) for s in self._fs.listStatus(path))

    def read_text(self, location: str) -> str:
        if not self.remote:
            return Path(local_path(location)).read_text(encoding="utf-8")
        stream = self._fs.open(self._path(location))
        try:
            scanner = self._jvm.java.util.Scanner(stream, "UTF-8").useDelimiter("\\A")
            return str(scanner.next()) if scanner.hasNext() else ""
        finally:
            stream.close()

    def write_text(self, location: str, text: str) -> None:
        """Write (or replace) a small text file."""
        if not self.remote:
            Path(local_path(location)).write_text(text, encoding="utf-8")
            return
        self._write_remote(self._path(location), text)

    def _write_remote(self, path: Any, text: str) -> None:
        stream = self._fs.create(path, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def create_exclusive(self, location: str, text: str) -> bool:
        """Publish a small file whole under a name nobody has taken: False if taken.

        Written under a temporary name first, then linked (locally) or renamed (Hadoop: an
        atomic rename that fails when the target exists, on HDFS), so that a reader never
        sees half a file and two writers never both win.
        """
        if not self.remote:
            target = Path(local_path(location))
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(temp, target)
                except FileExistsError:
                    return False
                return True
            finally:
                os.unlink(temp)
        target_path = self._path(location)
        temp_path = self._path(f"{location}.tmp-{uuid.uuid4().hex}")
        self._write_remote(temp_path, text)
        if self._fs.rename(temp_path, target_path):
            return True
        self._fs.delete(temp_path, False)
        return False

    def delete(self, location: str) -> None:
        """Remove a file or a directory tree; nothing when it is not there."""
        if not self.remote:
            path = local_path(location)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.lexists(path):
                os.unlink(path)
            return
        self._fs.delete(self._path(location), True)

    def glob_files(self, pattern: str) -> list[FileStat]:
        """Remote files matching a glob (a directory stands for the files in it, without the
        hidden ``_``/``.`` ones Spark skips too), with size and modification time."""
        assert self.remote
        found: list[FileStat] = []
        for status in self._fs.globStatus(self._path(pattern)) or []:
            inner = self._fs.listStatus(status.getPath()) if status.isDirectory() else [status]
            for s in inner:
                name = str(s.getPath().getName())
                if s.isDirectory() or name.startswith(("_", ".")):
                    continue
                found.append(
                    FileStat(
                        file_key(str(s.getPath().toString())), s.getLen(), s.getModificationTime()
                    )
                )
        return sorted(found, key=lambda f: f.path)
