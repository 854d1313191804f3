"""Shared pytest fixtures. Each block below belongs to one area; append new blocks, keep them
delimited, and do not reorder others' blocks. Imports stay at the top (ruff E402)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fsfixtures

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
