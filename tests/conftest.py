"""Shared pytest fixtures. Each block below belongs to one area; append new blocks, keep them
delimited, and do not reorder others' blocks. Imports stay at the top (ruff E402)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support import fsfixtures, realbroker

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


# ======================= real Apache Kafka broker (realbroker) — begin =======================
# Tests that use ``real_kafka`` / ``kafka_dist`` (marked ``realkafka``) need a real Kafka
# distribution (env DISKGUARD_KAFKA_HOME). Without it they are skipped, and the terminal summary
# says so in one loud line: a green run that never talked to Kafka must not look like one that
# did.

_REALKAFKA_SKIP = f"set {realbroker.ENV}=<kafka dist> to run"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if isinstance(report.longrepr, tuple) and _REALKAFKA_SKIP in str(report.longrepr[-1])
    ]
    if skipped:
        terminalreporter.write_sep(
            "!",
            f"REAL KAFKA BROKER TESTS SKIPPED: set {realbroker.ENV}=<kafka dist> "
            f"({len(skipped)} tests)",
            red=True,
            bold=True,
        )


@pytest.fixture(scope="session")
def kafka_dist() -> Path:
    """The Kafka distribution dir; a set but unusable one is a failure, never a skip."""
    dist = realbroker.kafka_home()
    if dist is None:
        pytest.skip(_REALKAFKA_SKIP)
    if not (dist / "bin" / "kafka-server-start.sh").is_file():
        pytest.fail(f"{realbroker.ENV}={dist}: no bin/kafka-server-start.sh there", pytrace=False)
    return dist


@pytest.fixture(scope="session")
def real_kafka(kafka_dist: Path) -> Iterator[realbroker.RealBroker]:
    """ONE real broker for the whole session: log dir on a 256 MiB loop ext4 (no reserved
    blocks), run as nobody, 1 s retention checks, SimpleAclAuthorizer with
    allow.everyone.if.no.acl.found; stopped at session end."""
    try:
        with (
            fsfixtures.loop_ext4(256 * fsfixtures.MiB, 0, name="kafka-disk") as mount,
            realbroker.running_broker(
                kafka_dist,
                mount / "kafka-logs",
                settings=(*realbroker.FAST_RETENTION, *realbroker.ACL_SETTINGS),
            ) as broker,
        ):
            yield broker
    except (fsfixtures.FilesystemSetupError, realbroker.BrokerSetupError) as exc:
        pytest.fail(f"cannot start the real Kafka broker: {exc}", pytrace=False)


# ======================= real Apache Kafka broker (realbroker) — end =========================


# ======================= a 64 MiB test disk (fsfixtures) — begin =======================


@pytest.fixture()
def disk() -> Iterator[Path]:
    """A 64 MiB loop-mounted ext4 with no reserved blocks, unmounted when the test ends: the
    disk the end-to-end retention and reliability tests fill and guard. A module that needs
    another disk defines its own ``disk``."""
    with fsfixtures.loop_ext4(64 * fsfixtures.MiB) as mount:
        yield mount


# ======================= a 64 MiB test disk (fsfixtures) — end =========================
