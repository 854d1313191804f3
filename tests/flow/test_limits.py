"""The edge that builds ``FlowLimits`` from the config, and the proof that the state machine
itself stays pure (no config, no TOML parser, no I/O module loaded by importing it)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from diskguard.config import parse_config
from diskguard.flow.limits import flow_limits
from diskguard.flow.state import FlowLimits, default_min_free_bytes

GiB = 1024**3

#: What ``import diskguard.flow.state`` may load: itself, its package markers and the plain
#: ``FilesystemUsage`` record.
PURE = {
    "diskguard",
    "diskguard.flow",
    "diskguard.flow.state",
    "diskguard.kafkalog",
    "diskguard.kafkalog.model",
}


def test_from_config_and_default_floor(tmp_path: Path) -> None:
    assert default_min_free_bytes(1000 * GiB) == 5 * GiB
    assert default_min_free_bytes(20 * GiB) == GiB
    cfg = parse_config(
        {
            "broker": {"log_dirs": [str(tmp_path)]},
            "flow_control": {
                "overfull_percent": 90,
                "underfull_percent": 80,
                "overfull_bytes": "9GiB",
                "underfull_bytes": "8GiB",
            },
            "alerts": {"low_space_percent": 70, "low_space_bytes": "2GiB"},
        },
        tmp_path / "d.toml",
    )
    limits = flow_limits(cfg, 20 * GiB)
    assert limits == FlowLimits(90, 80, 9 * GiB, 8 * GiB, GiB, 70, 2 * GiB)
    explicit = dataclasses.replace(
        cfg, flow_control=dataclasses.replace(cfg.flow_control, min_free_bytes=0)
    )
    assert flow_limits(explicit, 20 * GiB).min_free_bytes == 0


def test_state_machine_imports_nothing_from_the_edges() -> None:
    """A fresh interpreter, so modules other tests loaded do not hide an import."""
    code = (
        "import json, sys, diskguard.flow.state; print(json.dumps(["
        "sorted(m for m in sys.modules if m.startswith('diskguard')), "
        "'diskguard.configschema' in sys.modules, 'tomllib' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, schema, tomllib = json.loads(out.stdout)
    assert set(loaded) <= PURE, sorted(set(loaded) - PURE)
    assert not schema and not tomllib
