"""Shared pytest fixtures. Each block below belongs to one area; append new blocks, keep them
delimited, and do not reorder others' blocks. Imports stay at the top (ruff E402)."""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _pytest.nodeid import NodeId
from hypothesis import HealthCheck, settings

from support import fsfixtures, kafka
from support.kafka.broker import acl_settings, fast_retention
from support.kafka.cluster import KafkaCluster, running_broker
from support.kafka.guarded import DISK_BYTES, GuardedCluster, guarded_cluster
from support.kafka.node import ServerSetupError

# ======================= Hypothesis (property tests) — begin =======================
# No timing in tests: Hypothesis' deadline and its "input generation is slow" health check are
# timing assertions, and fail under the load of the real broker, Spark and loop filesystems
# that run beside them (seen: 1 input in 1.4 s on a loaded two-core machine).
settings.register_profile("diskguard", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("diskguard")
# ======================= Hypothesis (property tests) — end =========================


# ======================= real filesystems (fsfixtures) — begin =======================


def _fail_on_setup_error(exc: fsfixtures.FilesystemSetupError) -> None:
    # Never skip: a suite that silently skips its real-filesystem tests proves nothing.
    pytest.fail(f"cannot set up a real filesystem: {exc}", pytrace=False)


@pytest.fixture()
def loop_ext4() -> Iterator[Callable[..., Path]]:
    """Factory: ``loop_ext4(size_bytes, reserved_percent=0) -> mount point``.

    Every filesystem made is unmounted and its loop device detached when the test ends,
    whether it passed or not.
    """
    with contextlib.ExitStack() as stack:

        def make(size_bytes: int, reserved_percent: float = 0) -> Path:
            try:
                return stack.enter_context(fsfixtures.loop_ext4(size_bytes, reserved_percent))
            except fsfixtures.FilesystemSetupError as exc:
                _fail_on_setup_error(exc)
                raise

        yield make


@pytest.fixture()
def tmpfs() -> Iterator[Callable[[int], Path]]:
    """Factory: ``tmpfs(size_bytes) -> mount point``; unmounted when the test ends."""
    with contextlib.ExitStack() as stack:

        def make(size_bytes: int) -> Path:
            try:
                return stack.enter_context(fsfixtures.tmpfs(size_bytes))
            except fsfixtures.FilesystemSetupError as exc:
                _fail_on_setup_error(exc)
                raise

        yield make


@pytest.fixture()
def fill() -> Callable[..., Path]:
    """``fill(path, nbytes)``: write real (allocated, fsync'ed) bytes; see fsfixtures.fill."""
    return fsfixtures.fill


# ======================= real filesystems (fsfixtures) — end =========================


# ======================= real Apache Kafka (support.kafka) — begin =======================
# Tests marked ``realkafka`` run against a real Apache Kafka broker the suite starts itself:
# the newest 4.x from Maven Central by default (``support.kafka.target()`` reads
# DISKGUARD_KAFKA_VERSION / DISKGUARD_KAFKA_MODE / DISKGUARD_KAFKA_HOME). They are never
# skipped: a run that cannot resolve or start its broker fails with one line saying why.


def _kafka_setup_failed(exc: Exception) -> None:
    pytest.fail(f"cannot have a real Kafka broker: {exc}", pytrace=False)


def pytest_report_header(config: pytest.Config) -> str:
    try:
        return f"real Kafka: {kafka.target()}"
    except kafka.KafkaResolutionError as exc:
        return f"real Kafka: unavailable ({exc})"


@pytest.fixture(scope="session")
def kafka_target() -> kafka.Target:
    """The release, classpath and mode this run tests against."""
    try:
        return kafka.target()
    except kafka.KafkaResolutionError as exc:
        _kafka_setup_failed(exc)
        raise


@pytest.fixture(scope="session")
def real_kafka(kafka_target: kafka.Target) -> Iterator[KafkaCluster]:
    """ONE real broker for the whole session: log dir on a 256 MiB loop ext4 (no reserved
    blocks), run as nobody, 1 s retention checks, the release's ACL authorizer with
    allow.everyone.if.no.acl.found; stopped at session end. (Its work dir is not under
    pytest's temp root: pytest makes that 0700 again at every start, and nobody must read
    the broker's files.)"""
    release = kafka_target.release
    try:
        with (
            fsfixtures.loop_ext4(256 * fsfixtures.MiB, 0, name="kafka-disk") as mount,
            running_broker(
                release,
                kafka_target.classpath,
                mount / "kafka-logs",
                mode=kafka_target.mode,
                settings=fast_retention(release) | acl_settings(release, kafka_target.mode),
            ) as broker,
        ):
            yield broker
    except (fsfixtures.FilesystemSetupError, ServerSetupError) as exc:
        _kafka_setup_failed(exc)


# ======================= real Apache Kafka (support.kafka) — end =========================


# ======================= a 64 MiB test disk (fsfixtures) — begin =======================


@pytest.fixture()
def disk() -> Iterator[Path]:
    """A 64 MiB loop-mounted ext4 with no reserved blocks, unmounted when the test ends: the
    disk the end-to-end retention and reliability tests fill and guard. A module that needs
    another disk defines its own ``disk``."""
    with fsfixtures.loop_ext4(64 * fsfixtures.MiB) as mount:
        yield mount


# ======================= a 64 MiB test disk (fsfixtures) — end =========================


# ======================= a real three-broker cluster (support.kafka.guarded) — begin ========


@pytest.fixture(scope="session")
def real_cluster(kafka_target: kafka.Target) -> Iterator[GuardedCluster]:
    """ONE real three-broker cluster for the whole session (the tests of many guards, one
    cluster): each broker on its own 256 MiB loop ext4, SASL/PLAIN (users in
    ``support.kafka.guarded.USERS``), the release's ACL authorizer with
    allow.everyone.if.no.acl.found, no retention check after start-up (a trim stays pending on
    every replica), 256 MiB heaps. Tests start their
    own diskguard per broker (``guard_config``) and leave no filler, hold or ACL behind."""
    release = kafka_target.release
    try:
        with contextlib.ExitStack() as stack:
            mounts = [
                stack.enter_context(fsfixtures.loop_ext4(DISK_BYTES, 0, name=f"broker-{i}"))
                for i in (1, 2, 3)
            ]
            root = Path(tempfile.mkdtemp(prefix="diskguard-cluster-"))
            stack.callback(shutil.rmtree, root, True)
            yield stack.enter_context(
                guarded_cluster(
                    release,
                    kafka_target.classpath,
                    kafka_target.mode,
                    root,
                    mounts,
                    acl_settings(release, kafka_target.mode)
                    | {
                        # One retention check, at start-up: during the session a trim stays
                        # pending (its files on every replica) until the test looks.
                        "log.retention.check.interval.ms": "3600000",
                        # ...and a follower's own checkpoint never says where a partition
                        # starts: only its leader does (what a guard must ask).
                        "log.flush.start.offset.checkpoint.interval.ms": "3600000",
                        "log.segment.delete.delay.ms": "500",
                    },
                )
            )
    except (fsfixtures.FilesystemSetupError, ServerSetupError) as exc:
        _kafka_setup_failed(exc)


# ======================= a real three-broker cluster (support.kafka.guarded) — end ==========


# ======================= copy-on-write filesystems (fsfixtures) — begin =======================
# btrfs and XFS, where an unlink may free nothing (a snapshot, a reflinked copy) or free it
# only later (btrfs at its next commit, XFS by background inode inactivation). Their mkfs
# tools come from ``make tools`` (btrfs-progs, xfsprogs); missing, the test fails saying so.


@contextlib.contextmanager
def _mounts(
    open_fs: Callable[..., contextlib.AbstractContextManager[Path]],
) -> Iterator[Callable[..., Path]]:
    """A factory of ``open_fs(...)`` mounts, each unmounted when the test ends; a setup error
    fails the test in one line (never a skip)."""
    with contextlib.ExitStack() as stack:

        def make(*args: Any, **kwargs: Any) -> Path:
            try:
                return stack.enter_context(open_fs(*args, **kwargs))
            except fsfixtures.FilesystemSetupError as exc:
                _fail_on_setup_error(exc)
                raise

        yield make


@pytest.fixture()
def loop_btrfs() -> Iterator[Callable[..., Path]]:
    """Factory: ``loop_btrfs(size_bytes=256 MiB) -> mount point``; unmounted at the end."""
    with _mounts(fsfixtures.loop_btrfs) as make:
        yield make


@pytest.fixture()
def loop_xfs() -> Iterator[Callable[..., Path]]:
    """Factory: ``loop_xfs(size_bytes=320 MiB, reflink=True) -> mount point``."""
    with _mounts(fsfixtures.loop_xfs) as make:
        yield make


# ======================= copy-on-write filesystems (fsfixtures) — end =========================


# ======================= parallel workers (pytest-xdist) — begin =======================
# `make test` spreads the suite over several pytest-xdist workers (``-n``, ``--dist
# loadgroup``). A fixture of ours that outlives one test (the session broker ``real_kafka``,
# the three-broker ``real_cluster``, the SparkSession, a module's built wheel or cluster) must
# still be set up once, as in a serial run: every test that shares such a fixture with another
# (directly, or through a chain of tests that do) gets the same ``xdist_group`` and so runs on
# one worker, in collection order. Every other test is scheduled on its own.
# ``kafka_target`` is only a look-up (its classpath is cached on disk, resolved under a lock),
# so sharing it groups nothing.
_SHARED_BUT_CHEAP = frozenset({"kafka_target"})
_SCOPE_NODE: dict[str, type[pytest.Item | pytest.Collector] | None] = {
    "session": None,
    "package": pytest.Package,
    "module": pytest.Module,
    "class": pytest.Class,
}


def _ours(func: Callable[..., Any]) -> bool:
    """A fixture defined under tests/ (not pytest's or a plugin's, e.g. tmp_path_factory)."""
    return Path(inspect.getfile(func)).resolve().is_relative_to(Path(__file__).resolve().parent)


def _shared_fixtures(item: pytest.Item) -> set[str]:
    """One key per instance of a longer-lived fixture of ours that ``item`` uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    keys = set()
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name)
        if not defs or name in _SHARED_BUT_CHEAP:
            continue
        fixture = defs[-1]
        if fixture.scope == "function" or not _ours(fixture.func):  # not pytest's own
            continue
        scope_type = _SCOPE_NODE[fixture.scope]
        owner = item.getparent(scope_type) if scope_type else None
        keys.add(f"{owner.nodeid}::{name}" if owner else name)
    return keys


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks (it tags node ids with them)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Union-find over the fixture instances: tests joined by any one are one group, named by
    # its smallest key (the same on every worker: each collects the same items in one order).
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    uses = [(item, sorted(_shared_fixtures(item))) for item in items]
    for _, keys in uses:
        for key in keys[1:]:
            a, b = root(keys[0]), root(key)
            parent[max(a, b)] = min(a, b)
    worker = bool(os.environ.get("PYTEST_XDIST_WORKER")) and config.getvalue("loadgroup")
    for item, keys in uses:
        if keys:
            group = root(keys[0]).replace("@", "_").replace("[", "(").replace("]", ")")
            item.add_marker(pytest.mark.xdist_group(group))
            if worker:
                _tag_with_group(item, group)


def _tag_with_group(item: pytest.Item, group: str) -> None:
    """What xdist's own hook means to do with the mark: its scheduler reads the group from
    the node id's ``@group`` suffix. xdist 3.8 sets ``item._nodeid``, which pytest 9.2 no
    longer reads (the id is ``item._id``), so it is set here; if neither took, the run stops
    rather than start each shared fixture on every worker."""
    if not item.nodeid.endswith(f"@{group}"):
        item._id = NodeId.parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]
    if not item.nodeid.endswith(f"@{group}"):
        raise pytest.UsageError(f"cannot tag {item.nodeid} with its xdist group {group}")


# ======================= parallel workers (pytest-xdist) — end =========================
