"""pydantic's plugin discovery, skipped: diskguard's config models are not instrumented.

When it builds the first model, pydantic looks for plugins (installed packages declaring a
``pydantic`` entry point) through importlib.metadata: importing it (email, zipfile, csv, ...)
and scanning every installed distribution cost ~20 ms of each command's start-up (issue 15),
for plugins diskguard never asked for. pydantic's own switch, ``PYDANTIC_DISABLE_PLUGINS``,
skips the scan but not the import.

So, unless that variable is set (then pydantic decides, as it documents), pydantic's loader
module is replaced before the first model is built by one that reports no plugins, which is
what the switch set to ``__all__`` does. Validation itself is pydantic's, unchanged.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Any

_LOADER = "pydantic.plugin._loader"


class _NoPlugins(types.ModuleType):
    """Stands in for pydantic's loader: no plugins; any other name from the real module."""

    @staticmethod
    def get_plugins() -> tuple[()]:
        return ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # the import system asking (__path__: is it a package?)
            raise AttributeError(name)
        # A name a newer pydantic reads from its loader: load the real one and give up the
        # shortcut rather than fail.
        if sys.modules.get(_LOADER) is self:
            del sys.modules[_LOADER]
        return getattr(importlib.import_module(_LOADER), name)


def skip_plugin_discovery() -> None:
    """Call before the first pydantic model is defined; does nothing when pydantic already
    loaded its plugins or ``PYDANTIC_DISABLE_PLUGINS`` is set."""
    if "PYDANTIC_DISABLE_PLUGINS" in os.environ or _LOADER in sys.modules:
        return
    sys.modules[_LOADER] = _NoPlugins(_LOADER)
