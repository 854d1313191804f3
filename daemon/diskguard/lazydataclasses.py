"""Dataclass methods compiled when first called, not when their class is made (start-up).

Why: Python 3.11's ``dataclasses`` writes each generated method (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, a frozen class's ``__setattr__``/``__delattr__``) as source text
and compiles it with ``exec`` while the class statement runs: ~0.4 ms per method, and a
``plan`` with a broker makes 78 dataclasses and 459 methods at import (~0.1 s of a command
whose target is the time of ``du``), most of which it never calls (``__repr__``, the frozen
``__setattr__``, most ``__eq__``). :func:`install` makes ``dataclasses`` hand out a stand-in
for each; its first call compiles the method from the same text, with the same globals and
locals, puts it on the class in its place and calls it. The method is then the one
``dataclasses`` would have made, so behaviour (errors included) is unchanged.

Only on the Python whose ``_create_fn`` it knows (3.11's signature; later releases build
methods differently): elsewhere :func:`install` does nothing. Only in a command's own
process (``cli.main``), never under a test runner or a library caller, and not for
``aggregate``: a Spark job of seconds, whose driver runs in the command's process (start-up
is not its cost, and its serialization of classes to Python workers was not run with it).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

__all__ = ["install"]

#: ``dataclasses._create_fn``'s parameters on the releases this knows.
_KNOWN = ("name", "args", "body", "globals", "locals", "return_type")


def install() -> bool:
    """Make dataclass methods lazily compiled from now on; True if it did (or had)."""
    real = getattr(dataclasses, "_create_fn", None)
    if real is None or sys.version_info[:2] != (3, 11):
        return False
    if getattr(real, "_diskguard_lazy", False):
        return True
    code = getattr(real, "__code__", None)
    if code is None or code.co_varnames[: len(_KNOWN)] != _KNOWN:
        return False

    def create_fn(
        name: str,
        args: Any,
        body: Any,
        *,
        globals: Any = None,  # dataclasses' own keywords
        locals: Any = None,
        return_type: Any = dataclasses.MISSING,
    ) -> Any:
        args, body = list(args), list(body)  # generators in some callers: read them now
        compiled: Any = None

        def method(*a: Any, **kw: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                made = real(
                    name, args, body, globals=globals, locals=locals, return_type=return_type
                )
                made.__qualname__ = method.__qualname__
                compiled = made
                if a:  # a method: put the real one where this stand-in is
                    for klass in type(a[0]).__mro__:
                        if klass.__dict__.get(name) is method:
                            type.__setattr__(klass, name, made)
                            break
            return compiled(*a, **kw)

        method.__name__ = name
        method.__module__ = (globals or {}).get("__name__", method.__module__)
        return method

    create_fn._diskguard_lazy = True  # type: ignore[attr-defined]
    dataclasses._create_fn = create_fn  # type: ignore[attr-defined]
    return True
