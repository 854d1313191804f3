"""The pure core imports nothing from the edges: no config (its schema, tomllib), no scan, no
I/O module. Each import runs in a fresh interpreter, so what it loads is all its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: diskguard modules that do no I/O and read no config: the planner's world.
PURE = frozenset(
    {
        "diskguard",
        "diskguard.units",
        "diskguard.kafkalog",
        "diskguard.kafkalog.model",
        "diskguard.retention",
        "diskguard.retention.planner",
        "diskguard.retention.limits",
        "diskguard.retention.order",
        "diskguard.retention.reclaim",
        "diskguard.retention.mode",
        "diskguard.retention.setaside",
        "diskguard.retention.waittrace",
        "diskguard.flow",
        "diskguard.flow.state",
        "diskguard.fleet",
        "diskguard.fleet.aggregation",
    }
)
#: Third-party modules only an edge needs (config parsing).
EDGE_LIBRARIES = ("tomllib",)


def loaded_by(module: str) -> list[str]:
    """Every diskguard module and edge library loaded by importing ``module`` alone."""
    code = (
        f"import json, sys, {module}; "
        f"print(json.dumps(sorted(m for m in sys.modules "
        f"if m.split('.')[0] in ('diskguard', *{EDGE_LIBRARIES!r}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout
    loaded: list[str] = json.loads(out)
    return loaded


@pytest.mark.parametrize(
    "module",
    [
        "diskguard.retention.planner",
        "diskguard.retention.limits",
        "diskguard.retention.order",
        "diskguard.retention.reclaim",
        "diskguard.retention.mode",
        "diskguard.retention.setaside",
        "diskguard.retention.waittrace",
        "diskguard.flow.state",
        "diskguard.fleet.aggregation",
    ],
)
def test_a_pure_module_loads_only_pure_modules(module: str) -> None:
    assert [m for m in loaded_by(module) if m not in PURE] == []
