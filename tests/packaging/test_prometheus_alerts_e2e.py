"""A real Prometheus scrapes a running ``diskguard run`` on a real tmpfs and evaluates the
shipped rules: the overfull alert fires when the disk fills and resolves once it is freed.

The rule file is a test copy with the overfull alert's ``for:`` shortened (5m -> 2s); every
other rule is the shipped one, which also shows a long ``for:`` (over the ceiling, 15m)
holding its alert at pending. Bounded: every wait shares one 55 s budget.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.configs import write_config
from support.daemonproc import DaemonProc
from support.disks import fill_to
from support.net import free_port
from support.promserver import PrometheusServer

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "config" / "prometheus" / "diskguard-rules.yml"
MiB = 1024**2


def shortened_rules(dest: Path, alert: str, new_for: str) -> Path:
    """A copy of the shipped rules with ``alert``'s ``for:`` replaced by ``new_for``."""
    text = RULES.read_text()
    start = text.index(f"- alert: {alert}\n")
    end = text.find("- alert: ", start + 1)
    end = len(text) if end < 0 else end
    block, n = re.subn(r"^(\s+for: )\S+$", rf"\g<1>{new_for}", text[start:end], count=1, flags=re.M)
    assert n == 1, f"{alert} has no for: to shorten"
    dest.write_text(text[:start] + block + text[end:])
    return dest


def _alerts_named(prom: PrometheusServer, name: str, mount: Path) -> list[dict[str, Any]]:
    return [
        a
        for a in prom.alerts()
        if a["labels"]["alertname"] == name and a["labels"].get("mountpoint") == str(mount)
    ]


def test_overfull_alert_fires_and_resolves(tmpfs: Callable[[int], Path], tmp_path: Path) -> None:
    budget = time.monotonic() + 55

    def left() -> float:
        return max(0.5, budget - time.monotonic())

    mount = tmpfs(32 * MiB)
    log_dir = mount / "kafka-logs"
    log_dir.mkdir()
    port = free_port()
    config = write_config(
        tmp_path,
        log_dir,
        flow_control={"overfull_percent": 60, "underfull_percent": 40, "min_free_bytes": "1MiB"},
        snapshots={"interval": "60s"},
        metrics={"listen": f"127.0.0.1:{port}"},
        assume_delete_policy=None,
        disk_usage_percent=50,
        target_percent=45,
        check_interval="1s",
        mode="offline",
        offline_headroom=0,
    )
    rules = shortened_rules(tmp_path / "rules.yml", "DiskguardFilesystemOverfull", "2s")
    with DaemonProc(config) as daemon:
        daemon.wait_for("daemon_started", timeout=left())
        with PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{port}"], [rules]) as prom:
            overfull_series = f'diskguard_filesystem_overfull{{mountpoint="{mount}"}}'
            scraped = prom.wait_until("first scrape", lambda: prom.value(overfull_series), left())
            assert [v for _, v in scraped] == [0.0]
            assert scraped[0][0]["job"] == "diskguard"
            assert not _alerts_named(prom, "DiskguardFilesystemOverfull", mount)
            # The flow-control band as usage ratios, for the dashboard's lines.
            for name, ratio in (("overfull", 0.6), ("underfull", 0.4)):
                series = f'diskguard_filesystem_{name}_limit_ratio{{mountpoint="{mount}"}}'
                band = prom.wait_until(
                    f"{name} limit scraped", lambda s=series: prom.value(s), left()
                )
                assert [v for _, v in band] == [ratio]

            # Fill the disk past overfull (and the ceiling): nothing in the log dir can go.
            fill_to(mount, "filler", 75)
            daemon.wait_for("overfull", timeout=left())
            firing = prom.wait_until(
                "DiskguardFilesystemOverfull firing",
                lambda: [
                    a
                    for a in _alerts_named(prom, "DiskguardFilesystemOverfull", mount)
                    if a["state"] == "firing"
                ],
                left(),
            )
            alert = firing[0]
            assert alert["labels"]["severity"] == "critical"
            assert alert["labels"]["instance"] == f"127.0.0.1:{port}"
            assert alert["annotations"]["runbook"] == (
                "docs/operations.md#diskguardfilesystemoverfull"
            )
            assert f"Filesystem {mount} (" in alert["annotations"]["description"]
            assert 0.74 < float(alert["value"]) <= 0.8
            # The shipped 15m over-ceiling alert is only pending: for: is honoured.
            over = _alerts_named(prom, "DiskguardFilesystemOverCeiling", mount)
            assert [a["state"] for a in over] == ["pending"]
            # The retention cycles found nothing to delete and say how much they miss.
            unreachable = (
                f'diskguard_filesystem_retention_unreachable_bytes{{mountpoint="{mount}"}}'
            )
            prom.wait_until(
                "retention unreachable bytes > 0",
                lambda: [v for _, v in prom.value(unreachable) if v > 0],
                left(),
            )

            # Free the disk: overfull clears below underfull and the alert resolves.
            (mount / "filler").unlink()
            daemon.wait_for("overfull_cleared", timeout=left())
            prom.wait_until(
                "DiskguardFilesystemOverfull resolved",
                lambda: not _alerts_named(prom, "DiskguardFilesystemOverfull", mount),
                left(),
            )
            assert [v for _, v in prom.value(overfull_series)] == [0.0]
            prom.wait_until(
                "retention unreachable bytes back to 0",
                lambda: [v for _, v in prom.value(unreachable)] == [0.0],
                left(),
            )
        assert daemon.stop() == 0
