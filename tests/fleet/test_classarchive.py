"""The local Spark JVM's class archive: where it lives and which JVM options a run gets.

The dump itself happens at the end of the first local run on a machine (in this suite, one
of test_sparkjob's CLI runs, with the user's cache directory, when no archive exists yet);
these check the choices without starting a JVM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diskguard.fleet import classarchive


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")


@needs_java
def test_the_archive_is_named_after_java_and_pyspark_under_the_cache_dir(cache: Path) -> None:
    path = classarchive.archive_path()
    assert path is not None
    assert path.parent == cache / "diskguard"
    assert path.name.startswith("spark-classes-") and path.suffix == ".jsa"
    assert classarchive.archive_path() == path  # stable from run to run


@needs_java
def test_an_existing_archive_is_mapped_and_nothing_is_recorded(cache: Path) -> None:
    path = classarchive.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    options, record = classarchive.java_options(path)
    assert f"-XX:SharedArchiveFile={path}" in options
    assert "-XX:+RecordDynamicDumpInfo" not in options
    assert not record


@needs_java
def test_without_an_archive_the_run_records_its_classes_when_jcmd_is_there(cache: Path) -> None:
    path = classarchive.archive_path()
    assert path is not None
    options, record = classarchive.java_options(path)
    jcmd = shutil.which("jcmd", path=str(Path(classarchive._java() or "").parent))
    assert record == (jcmd is not None)
    assert ("-XX:+RecordDynamicDumpInfo" in options) == record
    assert not any(o.startswith("-XX:SharedArchiveFile") for o in options)


def test_no_java_means_no_archive_and_no_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(classarchive, "_java", lambda: None)
    assert classarchive.archive_path() is None
    assert classarchive.java_options(None) == ([], False)


def test_a_new_archive_removes_those_of_other_installs_only(tmp_path: Path) -> None:
    """An upgraded JVM or PySpark makes an archive of another name: the old ones go, each
    ~130 MB; another run's partial dump (``.tmp``) and unrelated files stay."""
    current = tmp_path / "spark-classes-aaaa.jsa"
    current.write_bytes(b"new")
    old = tmp_path / "spark-classes-bbbb.jsa"
    old.write_bytes(b"old")
    partial = tmp_path / "spark-classes-cccc.jsa.123.tmp"
    partial.write_bytes(b"partial")
    other = tmp_path / "notes.txt"
    other.write_text("keep")
    assert classarchive.remove_stale(current) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [current.name, partial.name, other.name]
    )


def test_partial_dumps_of_runs_that_died_go_and_the_others_stay(tmp_path: Path) -> None:
    """A run killed while its JVM dumped leaves ``<archive>.<pid>.tmp`` (~130 MB) that no
    dump would ever replace: gone once its process is gone and it is older than a dump may
    take; a live run's partial, a fresh one and other files stay."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(gone.stdout)
    old = 1_000_000_000.0
    abandoned = tmp_path / f"spark-classes-aaaa.jsa.{dead}.tmp"
    live = tmp_path / f"spark-classes-aaaa.jsa.{os.getpid()}.tmp"
    fresh = tmp_path / f"spark-classes-bbbb.jsa.{dead}.tmp"
    odd = tmp_path / "spark-classes-cccc.jsa.x.tmp"
    for path in (abandoned, live, fresh, odd):
        path.write_bytes(b"partial")
    for path in (abandoned, live, odd):
        os.utime(path, (old, old))
    now = old + classarchive.DUMP_TIMEOUT_S + 1
    os.utime(fresh, (now - 1, now - 1))
    assert classarchive.remove_abandoned(tmp_path, now) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, fresh.name, odd.name])


@needs_java
def test_a_run_that_maps_the_archive_removes_abandoned_partials(cache: Path) -> None:
    path = classarchive.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    abandoned = path.with_name(f"{path.name}.{int(gone.stdout)}.tmp")
    abandoned.write_bytes(b"partial")
    os.utime(abandoned, (1_000_000_000.0, 1_000_000_000.0))
    options, record = classarchive.java_options(path)
    assert f"-XX:SharedArchiveFile={path}" in options and not record
    assert not abandoned.exists()


def test_a_cache_dir_with_a_space_goes_without_an_archive(tmp_path: Path) -> None:
    """The JVM options are one string that Spark splits like a shell line."""
    spaced = tmp_path / "my cache" / "diskguard" / "spark-classes-aaaa.jsa"
    assert classarchive.java_options(spaced) == ([], False)
