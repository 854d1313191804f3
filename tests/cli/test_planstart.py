"""``plan``'s worker forked at the command's first moment: it lists what the checked config's
scan would, or its listing is not used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diskguard import planstart
from diskguard.cli import cli
from diskguard.config import DEFAULT_CONFIG_PATH, MAX_CONFIG_BYTES, DaemonConfig, load_config
from diskguard.kafkalog.listing import list_partition
from diskguard.kafkalog.parallellisting import MIN_DIRS
from support.kafkagen import SegmentSpec, write_partition

#: Enough partition dirs for the worker to list them (``parallellisting.MIN_DIRS``).
PARTITIONS = MIN_DIRS


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ([], str(DEFAULT_CONFIG_PATH)),
        (["--json"], str(DEFAULT_CONFIG_PATH)),
        (["-c", "/x.toml"], "/x.toml"),
        (["-c/x.toml", "--json"], "/x.toml"),
        (["--json", "--config", "/x.toml"], "/x.toml"),
        (["--config=/x.toml"], "/x.toml"),
        (["-c"], None),
        (["-c", "/a", "-c", "/b"], None),
        (["--help"], None),
        (["-h"], None),
        (["--json", "extra"], None),
        (["--config="], None),
    ],
)
def test_the_config_path_is_read_as_click_reads_it(args: list[str], path: str | None) -> None:
    assert planstart.config_path(args) == path


def test_the_defaults_are_the_config_s() -> None:
    assert str(DEFAULT_CONFIG_PATH) == planstart.DEFAULT_CONFIG
    assert planstart._CONFIG_LIMIT == MAX_CONFIG_BYTES
    assert planstart.MIN_DIRS == MIN_DIRS
    assert str(DaemonConfig().state_dir) == planstart.DEFAULT_STATE_DIR


def _config(tmp_path: Path, log_dir: Path, extra: str = "") -> Path:
    config = tmp_path / "diskguard.toml"
    config.write_text(
        f'[broker]\nlog_dirs = ["{log_dir}"]\n\n[retention]\ndisk_usage_percent = 1.0\n'
        f'mode = "dry-run"\nassume_delete_policy = [".*"]\n{extra}\n'
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
    )
    return config


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared by the module's tests: each leaves it as it found it."""
    logs = tmp_path_factory.mktemp("planstart") / "logs"
    for p in range(PARTITIONS):
        write_partition(logs, "orders", p, [SegmentSpec(records=3)] * (2 + p % 3))
    return logs


@pytest.fixture(autouse=True)
def _nothing_left_started() -> Iterator[None]:
    yield
    left = planstart._started
    planstart._started = None
    if left is not None:
        left[0].close()


def _taken_listings(config: Path, full: bool = False) -> tuple[dict[str, object], bool]:
    """What ``take`` hands the scan for each dir, and whether it was the early worker's."""
    checked = load_config(config, writes=False)
    assert planstart._started is not None
    first = planstart._started[1]  # the worker's stream of what it listed from the start
    taken = planstart.take(checked, full)
    assert taken is not None
    worker, cache = taken
    try:
        early = cache._early
        adopted = early is not None and early._stream is first
        paths = cache.live_paths([os.fspath(d) for d in checked.broker.log_dirs])
        cache.prefetch(paths, full)
        return {p: cache.listing(p, full) for p in paths}, adopted
    finally:
        worker.close()


def test_the_early_listing_is_the_scan_s_own(tmp_path: Path, tree: Path) -> None:
    config = _config(tmp_path, tree)
    planstart.start(["-c", str(config), "--json"], force=True)
    assert planstart._started is not None
    got, adopted = _taken_listings(config)
    assert adopted
    assert len(got) == PARTITIONS
    for path, listing in got.items():
        assert listing == list_partition(path, False)


def test_a_dir_made_meanwhile_sends_the_usual_request(tmp_path: Path, tree: Path) -> None:
    config = _config(tmp_path, tree)
    planstart.start(["-c", str(config)], force=True)
    assert planstart._started is not None
    # The worker sends its paths first: once they came, change what the scan will see.
    stream = planstart._started[1]
    deadline = time.monotonic() + 60
    while not stream._ready and time.monotonic() < deadline:
        stream.drain()
        time.sleep(0.01)
    assert stream._ready, "the worker sent nothing in 60 s"
    late = write_partition(tree, "late", 0, [SegmentSpec(records=3)] * 2).path
    try:
        got, adopted = _taken_listings(config)
        assert not adopted
        assert len(got) == PARTITIONS + 1
        for path, listing in got.items():
            assert listing == list_partition(path, False)
    finally:
        shutil.rmtree(late)


def test_a_few_dirs_are_listed_here_without_waiting_for_the_worker(tmp_path: Path) -> None:
    logs = tmp_path / "few"
    for p in range(3):
        write_partition(logs, "orders", p, [SegmentSpec(records=3)] * 2)
    config = _config(tmp_path, logs)
    planstart.start(["-c", str(config)], force=True)
    got, adopted = _taken_listings(config)
    assert not adopted
    for path, listing in got.items():
        assert listing == list_partition(path, False)
    assert len(got) == 3


def test_a_byte_budget_lists_every_file_again(tmp_path: Path, tree: Path) -> None:
    config = _config(tmp_path, tree)
    planstart.start(["-c", str(config)], force=True)
    got, adopted = _taken_listings(config, full=True)
    assert not adopted
    for path, listing in got.items():
        assert listing == list_partition(path, True)


def test_log_dirs_from_server_properties_are_left_to_the_command(
    tmp_path: Path, tree: Path
) -> None:
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={tree}\n")
    config = tmp_path / "diskguard.toml"
    config.write_text(
        f'[broker]\nserver_properties = "{props}"\n\n[retention]\ndisk_usage_percent = 1.0\n'
        f'mode = "dry-run"\n\n[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
    )
    planstart.start(["-c", str(config)], force=True)
    got, adopted = _taken_listings(config)
    assert not adopted
    assert len(got) == PARTITIONS


def test_a_config_the_worker_cannot_read_leaves_the_command_as_it_was(
    tmp_path: Path, tree: Path
) -> None:
    planstart.start(["-c", str(tmp_path / "missing.toml")], force=True)
    assert planstart._started is not None
    got, adopted = _taken_listings(_config(tmp_path, tree))
    assert not adopted
    assert len(got) == PARTITIONS


def _steady(plan: dict[str, Any]) -> dict[str, Any]:
    """``plan --json`` without the disk's usage, which others move between two runs (the
    disk is shared; every closed segment goes whatever it is)."""
    for d in plan["deletions"]:
        for moving in ("usage_percent", "excess_bytes"):
            d["why"].pop(moving)
    return plan


def _console_plan(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``plan -c config`` the console script's way (``python -m diskguard``: ``launch``)."""
    return subprocess.run(
        [sys.executable, "-m", "diskguard", "plan", "-c", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _clicks_plan(config: Path) -> tuple[str, str]:
    """``plan -c config --json`` through click's runner (no early start, no kept listing)."""
    result = CliRunner().invoke(cli, ["plan", "-c", str(config), "--json"])
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


def _same_plan(ours: str, theirs: str) -> None:
    a, b = _steady(json.loads(ours)), _steady(json.loads(theirs))
    for key in ("deletions", "protected", "not_live", "mode", "scope"):
        assert a[key] == b[key], key


def test_plan_started_early_says_what_plan_says(tmp_path: Path, tree: Path) -> None:
    """The console script's way (``python -m diskguard``: ``launch``) against click's
    runner (no early start): the same JSON, the same warnings; a refused config is refused
    the same way and leaves no child behind."""
    config = _config(tmp_path, tree)
    early = _console_plan(config, "--json")
    assert early.returncode == 0, early.stderr
    stdout, stderr = _clicks_plan(config)
    _same_plan(early.stdout, stdout)
    assert len(json.loads(early.stdout)["deletions"]) == sum(1 + p % 3 for p in range(PARTITIONS))
    assert early.stderr == stderr

    bad = tmp_path / "bad.toml"
    bad.write_text(f'[broker]\nlog_dirs = ["{tree}"]\n\n[retention]\nmode = "sometimes"\n')
    refused = _console_plan(bad)
    assert refused.returncode == 2
    assert "retention.mode" in refused.stderr and "Traceback" not in refused.stderr
    deadline = time.monotonic() + 30
    while _running_with(str(bad)) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILLed at exit: gone once the kernel has torn it down
    assert not _running_with(str(bad)), "the worker outlived its command"


def _running_with(arg: str) -> list[int]:
    """Live processes (not zombies) whose command line holds ``arg`` (a forked worker's is
    its command's)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if arg.encode() in cmdline and state != "Z":
            found.append(int(pid))
    return found


def test_a_plan_after_a_plan_takes_its_listings_and_says_what_plan_says(
    tmp_path: Path, tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first plan keeps what it listed in the state dir (``listingstore``); the next
    takes each unchanged dir's listing from there and lists a changed one afresh: each says
    what click's runner (no early start, no store) says, byte for byte."""
    from diskguard.host.claims import Claims
    from diskguard.kafkalog.listingstore import SETTLE_S, load
    from diskguard.kafkalog.parallellisting import use_store

    config = _config(tmp_path, tree)
    (tmp_path / "state").mkdir()
    newest = max(os.stat(p).st_ctime for p in tree.iterdir())
    time.sleep(max(0.0, newest + SETTLE_S + 0.1 - time.time()))  # dirs changed just now: not kept

    def plan() -> tuple[str, str]:
        got = _console_plan(config, "--json")
        assert got.returncode == 0, got.stderr
        return got.stdout, got.stderr

    first = plan()
    assert len(load(tmp_path / "state")) == PARTITIONS
    # The worker's side, here: it takes every listing from the config's state dir (and
    # leaves this test runner's dataclasses as they are: ``lazydataclasses``).
    monkeypatch.setattr("diskguard.lazydataclasses.install", lambda: False)
    claims, fd = Claims.made(1 << 40)
    os.close(fd)
    try:
        items = list(planstart.listed_from_config(str(config), None, claims))
    finally:
        use_store(None)
    assert len(items[0]) == PARTITIONS
    assert [item[3][1] for item in items[1:]] == [False] * PARTITIONS  # none listed afresh
    second = plan()
    reference = _clicks_plan(config)
    _same_plan(first[0], reference[0])
    _same_plan(second[0], reference[0])
    assert first[1] == second[1] == reference[1]

    extra = tree / "orders-0" / f"{1000:020d}.log"
    extra.write_bytes(b"")
    try:
        third, reference = plan(), _clicks_plan(config)
        _same_plan(third[0], reference[0])
        assert third[1] == reference[1]
        chosen = {(d["partition"], d["base_offset"]) for d in json.loads(third[0])["deletions"]}
        assert len(chosen) == 1 + sum(1 + p % 3 for p in range(PARTITIONS))  # one more closed
    finally:
        extra.unlink()
