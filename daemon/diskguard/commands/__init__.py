"""CLI subcommands, one module per command family; each registers itself on ``diskguard.cli.cli``.

Importing every module here keeps ``cli.py`` free of a hand-maintained list that parallel
work would keep colliding on.
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    importlib.import_module(f"{__name__}.{_module.name}")
