"""What machine a benchmark ran on, recorded beside its numbers."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def _first(path: str, key: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _disk_of(path: Path) -> dict[str, Any]:
    """Block device behind ``path`` and what the kernel says about it."""
    try:
        dev = os.stat(path).st_dev
        name = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve().name
        queue = Path(f"/sys/block/{name}/queue")
        return {
            "device": name,
            "rotational": (queue / "rotational").read_text().strip() == "1",
            "scheduler": (queue / "scheduler").read_text().strip(),
            "size_bytes": int(Path(f"/sys/block/{name}/size").read_text()) * 512,
        }
    except OSError as exc:
        return {"error": str(exc)}


def machine_info() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    mem_kb = _first("/proc/meminfo", "MemTotal")
    return {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": commit,
        "nproc": os.cpu_count(),
        "cpu_model": _first("/proc/cpuinfo", "model name"),
        "memory": mem_kb,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "root_disk": _disk_of(ROOT),
    }


def load_average() -> str:
    """The 1, 5 and 15 minute load averages as the kernel prints them, for a figure's caption:
    on a shared machine a benchmark says how loaded it was."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
