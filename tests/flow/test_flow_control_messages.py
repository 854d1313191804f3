"""The daemon says producers are blocked only when an actuator acted, naming it (issue 13
item 2): with no actuator configured, an overfull disk is announced as such, and the log says
plainly that nobody holds producers back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from support.configs import write_config
from support.daemonproc import DaemonProc

MiB = 1024 * 1024


def _config(tmp_path: Path, mount: Path, **flow_control: object) -> Path:
    return write_config(
        tmp_path,
        mount / "kafka",
        flow_control={
            "overfull_percent": 50,
            "underfull_percent": 40,
            "min_free_bytes": "0",
            **flow_control,
        },
        state_dir=tmp_path / "s",
        name="c.toml",
        assume_delete_policy=None,
        check_interval="200ms",
        mode="offline",
    )


def test_no_actuator_means_producers_are_not_said_to_be_blocked(
    tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    mount = tmpfs(16 * MiB)
    (mount / "kafka").mkdir()
    (mount / "filler").write_bytes(b"x" * (10 * MiB))
    with DaemonProc(_config(tmp_path, mount)) as daemon:
        over = daemon.wait_for("overfull", timeout=30)
        # The Qpid text is a contract and stays.
        assert over["message"] == "store overfull, flow control will be enforced"
        applied = daemon.wait_for("flow_control_applied", timeout=30, transition="overfull")
        assert applied["actuators"] == [] and applied["level"] == "warning"
        assert applied["message"] == "no actuator configured: producers are NOT held back"
        alert = daemon.wait_for("disk_alert", timeout=30, alert_level=2)
        assert "blocked" not in alert["message"], alert
        (mount / "filler").unlink()
        cleared = daemon.wait_for("flow_control_applied", timeout=30, transition="overfull_cleared")
        assert cleared["actuators"] == []


def test_an_acting_actuator_is_named(tmpfs: Callable[[int], Path], tmp_path: Path) -> None:
    mount = tmpfs(16 * MiB)
    (mount / "kafka").mkdir()
    hook = tmp_path / "hook.sh"
    hook.write_text("#!/bin/sh\ntrue\n")
    hook.chmod(0o755)
    (mount / "filler").write_bytes(b"x" * (10 * MiB))
    cfg = _config(tmp_path, mount, actuators=["exec"], on_change=[hook])
    with DaemonProc(cfg) as daemon:
        applied = daemon.wait_for("flow_control_applied", timeout=30, transition="overfull")
        assert applied["actuators"] == ["exec"]
        assert applied["message"] == "producers are being blocked by: exec"
