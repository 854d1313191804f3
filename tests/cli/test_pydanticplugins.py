"""pydantic's plugin discovery skipped for diskguard's config models (issue 15: start-up):
no importlib.metadata import, no scan of the installed distributions, unless
``PYDANTIC_DISABLE_PLUGINS`` is set, in which case pydantic decides as it documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = (
    "import json, sys\n"
    "import diskguard.config\n"
    "loader = sys.modules['pydantic.plugin._loader']\n"
    "print(json.dumps([type(loader).__name__, 'importlib.metadata' in sys.modules]))\n"
)


def _probe(**env: str) -> list[object]:
    base = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={**base, **env},
    ).stdout
    result: list[object] = json.loads(out)
    return result


def test_config_models_are_built_without_plugin_discovery() -> None:
    assert _probe() == ["_NoPlugins", False]


def test_pydantics_own_switch_is_left_to_pydantic() -> None:
    assert _probe(PYDANTIC_DISABLE_PLUGINS="") == ["module", True]


def test_another_name_from_the_loader_falls_back_to_the_real_module() -> None:
    code = (
        "import sys\n"
        "import diskguard.config\n"
        "loader = sys.modules['pydantic.plugin._loader']\n"
        "print(loader.PYDANTIC_ENTRY_POINT_GROUP, type(sys.modules[loader.__name__]).__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert out.split() == ["pydantic", "module"]
