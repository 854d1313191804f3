"""A real Apache Kafka broker's classpath, resolved from Maven Central by name and cached.

``mvn dependency:build-classpath`` over the committed ``pom.xml`` (this directory) resolves
``org.apache.kafka:kafka_<scala>:<version>`` with its runtime dependencies into ``~/.m2``. The
broker runs as ``nobody``, who cannot enter root's home: the jars are hard-linked (copied where
a link cannot be made) into the cache dir (``$DISKGUARD_KAFKA_CACHE``, default
``/var/cache/diskguard/kafka`` for root, ``~/.cache/diskguard/kafka`` otherwise), one dir and one
classpath file per release, so the second run costs nothing and needs no network. A
distribution directory (``DISKGUARD_KAFKA_HOME``: ``libs/``) stands in for Maven where an
operator has one.

Resolution holds a lock on the cache dir: parallel test workers (or two runs) that all miss
the cache run one ``mvn`` at a time (Maven does not guard its shared ``~/.m2`` against a
second process), and the later ones then find the first's classpath file, written whole and
renamed into place so no reader sees half a list.

Resolution that fails raises ``KafkaResolutionError`` with one line saying why: a test run
that cannot have its broker must say so, not skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

POM = Path(__file__).with_name("pom.xml")


class KafkaResolutionError(RuntimeError):
    """The broker's classpath could not be had (no mvn, no network, an unknown version)."""


@dataclass(frozen=True, order=True)
class Release:
    """One Apache Kafka release as Maven names it: ``kafka_<scala>:<version>``."""

    version: tuple[int, int, int]
    scala: str = "2.13"

    @property
    def text(self) -> str:
        return ".".join(map(str, self.version))

    @property
    def artifact(self) -> str:
        return f"kafka_{self.scala}"

    @property
    def coordinates(self) -> str:
        return f"org.apache.kafka:{self.artifact}:{self.text}"

    @property
    def has_kraft(self) -> bool:
        """Combined broker+controller nodes are usable from 3.3 (KIP-833 marked KRaft ready)."""
        return self.version >= (3, 3, 0)

    @property
    def has_zookeeper(self) -> bool:
        """4.0 removed ZooKeeper mode."""
        return self.version < (4, 0, 0)

    def modes(self) -> tuple[str, ...]:
        return tuple(m for m, ok in (("kraft", self.has_kraft), ("zk", self.has_zookeeper)) if ok)

    def __str__(self) -> str:
        return f"{self.artifact}:{self.text}"


#: The newest 4.x: what every ``make test`` runs against.
NEWEST = Release((4, 4, 0))

_RELEASE = re.compile(r"^(?:kafka_(?P<scala>2\.1[0-3]):)?(?P<v>\d+\.\d+\.\d+)$")


def parse_release(text: str) -> Release:
    """``4.4.0``, ``3.9.2`` or ``kafka_2.12:2.8.2`` (Scala 2.13 unless named)."""
    match = _RELEASE.match(text.strip())
    if match is None:
        raise KafkaResolutionError(
            f"{text!r} is not a Kafka release (want e.g. 4.4.0 or kafka_2.12:2.8.2)"
        )
    major, minor, patch = (int(p) for p in match["v"].split("."))
    return Release((major, minor, patch), match["scala"] or "2.13")


def cache_dir() -> Path:
    configured = os.environ.get("DISKGUARD_KAFKA_CACHE", "").strip()
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/cache/diskguard/kafka")
    return Path.home() / ".cache" / "diskguard" / "kafka"


def _readable_copies(jars: list[Path], into: Path) -> list[Path]:
    """``jars`` linked into ``into`` (world-readable dirs), so ``nobody`` can load them."""
    into.mkdir(parents=True, exist_ok=True)
    for path in [into, *into.parents]:
        if path == Path("/") or path.stat().st_mode & 0o005 == 0o005:
            break
        os.chmod(path, path.stat().st_mode | 0o005)
    placed = []
    for jar in jars:
        dest = into / jar.name
        if not dest.is_file():
            try:
                os.link(jar, dest)
            except OSError:
                shutil.copyfile(jar, dest)
        os.chmod(dest, 0o644)
        placed.append(dest)
    return placed


def _cached(path: Path) -> tuple[Path, ...] | None:
    try:
        jars = tuple(Path(p) for p in path.read_text().strip().split(os.pathsep) if p)
    except OSError:
        return None
    return jars if jars and all(j.is_file() for j in jars) else None


def classpath(
    release: Release, profiles: tuple[str, ...] = (), **properties: str
) -> tuple[Path, ...]:
    """The broker's jars, from the cache or from ``mvn`` (network on the first call only).

    ``profiles`` are the pom's (``tiered``: Kafka's LocalTieredStorage); ``properties`` set
    the pom's properties (``kafka_tiered_version="4.3.1"`` for ``kafka.tiered.version``).
    """
    extra = "".join(f"-{p}" for p in profiles) + "".join(
        f"-{k}={v}" for k, v in sorted(properties.items())
    )
    target = cache_dir() / f"{release.artifact}-{release.text}{extra}.classpath"
    cached = _cached(target)
    if cached is not None:
        return cached
    target.parent.mkdir(parents=True, exist_ok=True)
    with _resolution_lock(target.parent):
        # Another worker may have resolved it while this one waited for the lock.
        return _cached(target) or _resolve(release, profiles, properties, target)


@contextlib.contextmanager
def _resolution_lock(cache: Path) -> Iterator[None]:
    """One resolution at a time per cache dir (released when the holder exits, even killed)."""
    with open(cache / ".resolve.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _resolve(
    release: Release, profiles: tuple[str, ...], properties: dict[str, str], target: Path
) -> tuple[Path, ...]:
    """``mvn dependency:build-classpath``, the jars linked into the cache, ``target`` written."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaResolutionError(
            f"cannot resolve {release.coordinates}: mvn not found (`make tools` installs Maven "
            "and a JDK 17)"
        )
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as tmp:
        out = Path(tmp.name)
    command = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(POM),
        f"-Dkafka.artifact={release.artifact}",
        f"-Dkafka.version={release.text}",
        *(f"-D{k.replace('_', '.')}={v}" for k, v in properties.items()),
        *(f"-P{p}" for p in profiles),
        "dependency:build-classpath",
        f"-Dmdep.outputFile={out}",
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        out.unlink(missing_ok=True)
        raise KafkaResolutionError(
            f"cannot resolve {release.coordinates}: mvn took over 15 minutes"
        ) from None
    if result.returncode != 0:
        out.unlink(missing_ok=True)
        raise KafkaResolutionError(
            f"cannot resolve {release.coordinates} with Maven: {_first_error(result.stdout)}"
        )
    resolved = [Path(p) for p in out.read_text().strip().split(os.pathsep) if p]
    out.unlink()
    if not resolved:
        raise KafkaResolutionError(f"mvn resolved {release.coordinates} but listed no jars")
    placed = _readable_copies(resolved, target.with_suffix(""))
    written = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    written.write_text(os.pathsep.join(map(str, placed)) + "\n")
    os.chmod(written, 0o644)
    os.replace(written, target)
    return tuple(placed)


def _first_error(output: str) -> str:
    for line in output.splitlines():
        text = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
        if text.startswith("[ERROR]") and len(text) > len("[ERROR] "):
            return text[len("[ERROR] ") :][:400]
    return "mvn failed (no [ERROR] line)"


def from_distribution(home: Path) -> tuple[Release, tuple[Path, ...]]:
    """A Kafka distribution directory's release and jars (``libs/kafka_2.12-2.2.0.jar``)."""
    libs = home / "libs"
    jars = tuple(sorted(libs.glob("*.jar")))
    for jar in jars:
        match = re.fullmatch(r"kafka_(2\.1[0-3])-(\d+\.\d+\.\d+)\.jar", jar.name)
        if match:
            return parse_release(f"kafka_{match[1]}:{match[2]}"), jars
    raise KafkaResolutionError(
        f"{home}: no libs/kafka_<scala>-<version>.jar (not a Kafka distribution?)"
    )
