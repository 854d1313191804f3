"""``state.json`` as a typed, versioned contract: the daemon writes it and the commands read it
through ``retention.daemonstate`` only; a file of another version or shape is refused in one
line, and the unversioned files of earlier releases still read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from diskguard.config import load_config
from diskguard.retention.daemonstate import (
    STATE_FILE,
    DaemonState,
    FilesystemState,
    LastDeletion,
    ReclaimView,
    SetAsideEntry,
    StateFileError,
    daemon_memory,
    read_state,
    write_state,
)
from support.cli import run_cli
from support.configs import write_config

#: ``state.json`` exactly as the daemon wrote it before the file had a version.
UNVERSIONED = {
    "pid": 0,  # replaced by a live pid where the test needs a running daemon
    "updated": 0.0,
    "filesystems": {
        "/data": {
            "flow_state": "overfull",
            "alert_level": 2,
            "last_deletion": {
                "ts": 1_700_000_000.5,
                "topic": "orders",
                "partition": 3,
                "base_offset": 1200,
                "bytes": 1048576,
                "mode": "broker",
            },
            "pending_reclaim_bytes": 4096,
            "reclaim": {
                "check_interval_s": 300.0,
                "delete_delay_s": 60.0,
                "settings_source": "defaults",
                "latency_p50_s": None,
                "latency_max_s": None,
                "latency_samples": 0,
                "growth_bytes_per_s": 2048.5,
                "expected_latency_s": 360.0,
                "latency_source": "settings",
                "headroom_needed_bytes": 737280,
                "predicted_usage_percent": 71.25,
                "broker_mode": True,
            },
        },
        "/other": {
            "flow_state": "normal",
            "alert_level": 0,
            "last_deletion": None,
            "pending_reclaim_bytes": 0,
            "reclaim": None,
        },
    },
    "set_aside": [{"topic": "orders", "partition": 1, "error": "EPERM", "until": 1.7e9}],
}


def _write(state_dir: Path, data: object) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).write_text(json.dumps(data))


def test_what_the_daemon_writes_reads_back_the_same(tmp_path: Path) -> None:
    state = DaemonState(
        pid=os.getpid(),
        updated=1_700_000_000.0,
        filesystems={
            "/data": FilesystemState(
                flow_state="overfull",
                alert_level=2,
                last_deletion=LastDeletion(1.5, "orders", 3, 1200, 1024, "offline"),
                pending_reclaim_bytes=10,
                reclaim=ReclaimView(300.0, 60.0, "broker", growth_bytes_per_s=12.5),
            )
        },
        set_aside=[SetAsideEntry("orders", 1, "EPERM", 1.7e9)],
    )
    write_state(state, tmp_path)
    written = json.loads((tmp_path / STATE_FILE).read_text())
    assert written["version"] == 1
    assert read_state(tmp_path) == state
    assert state.rates() == {"/data": 12.5}


def test_an_unversioned_file_of_an_earlier_release_still_reads(tmp_path: Path) -> None:
    _write(tmp_path, UNVERSIONED)
    state = read_state(tmp_path)
    assert state is not None and state.version == 1
    data = state.filesystems["/data"]
    assert (data.flow_state, data.alert_level, data.pending_reclaim_bytes) == ("overfull", 2, 4096)
    assert data.last_deletion == LastDeletion(1_700_000_000.5, "orders", 3, 1200, 1048576, "broker")
    assert data.reclaim is not None and data.reclaim.broker_mode is True
    assert state.rates() == {"/data": 2048.5}
    assert state.filesystems["/other"] == FilesystemState()
    assert state.set_aside == [SetAsideEntry("orders", 1, "EPERM", 1.7e9)]


def test_an_unknown_version_is_refused_in_one_line(tmp_path: Path) -> None:
    _write(tmp_path, {**UNVERSIONED, "version": 2})
    with pytest.raises(StateFileError) as caught:
        read_state(tmp_path)
    message = str(caught.value)
    assert message == (
        f"{tmp_path / STATE_FILE}: version 2 is not one this diskguard reads (it reads "
        "version 1; written by a newer diskguard?); ignored"
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    ("change", "where"),
    [
        # A key renamed on one side no longer reads as "no rate": the reader names it.
        (lambda d: d["filesystems"]["/data"]["reclaim"].update(growth_rate=1.0), "growth_rate"),
        (lambda d: d["filesystems"]["/data"].update(alert_level="2"), "alert_level"),
        (lambda d: d.update(set_aside={"not": "a list"}), "set_aside"),
        (lambda d: d["filesystems"].update({"/x": []}), "/x"),
    ],
)
def test_a_file_of_another_shape_is_refused_naming_the_key(
    tmp_path: Path, change: object, where: str
) -> None:
    data = json.loads(json.dumps(UNVERSIONED))
    change(data)  # type: ignore[operator]
    _write(tmp_path, data)
    with pytest.raises(StateFileError, match=where):
        read_state(tmp_path)


def test_no_file_or_a_torn_one_is_no_state(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None
    (tmp_path / STATE_FILE).write_text('{"pid": 12')
    assert read_state(tmp_path) is None


def _config(tmp_path: Path) -> Path:
    (tmp_path / "logs").mkdir()
    return write_config(tmp_path, tmp_path / "logs")


def test_the_commands_go_on_without_a_refused_file_and_say_why(tmp_path: Path) -> None:
    config = _config(tmp_path)
    state_dir = tmp_path / "state"
    _write(state_dir, {**UNVERSIONED, "pid": os.getpid(), "version": 7})
    taken = daemon_memory(load_config(config))
    assert taken.rates == {} and taken.problem is not None and "version 7" in taken.problem
    line = (
        f"{state_dir / STATE_FILE}: version 7 is not one this diskguard reads (it reads "
        "version 1; written by a newer diskguard?); ignored"
    )
    for command in (("status",), ("plan",)):
        proc = run_cli(*command, "-c", str(config))
        assert proc.returncode == 0, proc.stderr
        assert [x for x in proc.stderr.splitlines() if "state.json" in x] == [f"warning: {line}"]
    status = json.loads(run_cli("status", "--json", "-c", str(config)).stdout)
    assert not status["daemon_running"] and status["warnings"] == [line]


def test_status_reads_a_running_daemons_unversioned_file(tmp_path: Path) -> None:
    config = _config(tmp_path)
    mount = json.loads(run_cli("status", "--json", "-c", str(config)).stdout)["filesystems"][0]
    data = json.loads(json.dumps(UNVERSIONED))
    data["pid"] = os.getpid()
    data["filesystems"] = {mount["mount"]: data["filesystems"]["/data"]}
    _write(tmp_path / "state", data)
    status = json.loads(run_cli("status", "--json", "-c", str(config)).stdout)
    (fs,) = status["filesystems"]
    assert status["daemon_running"] and fs["flow_state_source"] == "daemon"
    assert fs["reclaim"] == UNVERSIONED["filesystems"]["/data"]["reclaim"]  # type: ignore[index]
    assert fs["last_deletion"]["topic"] == "orders"
    assert status["set_aside"] == UNVERSIONED["set_aside"]


@pytest.mark.parametrize("pid", [0, -1, 2**31, 10**30])
def test_a_pid_no_process_can_have_is_no_running_daemon(tmp_path: Path, pid: int) -> None:
    """A state file naming a pid no process can have (damaged, forged, another system's) is
    the state of no running daemon: ``status`` says so, never an ``OverflowError``."""
    config = _config(tmp_path)
    _write(tmp_path / "state", {**UNVERSIONED, "pid": pid})
    assert daemon_memory(load_config(config)).rates == {}
    proc = run_cli("status", "--json", "-c", str(config))
    assert proc.returncode == 0, proc.stderr
    assert not json.loads(proc.stdout)["daemon_running"]
