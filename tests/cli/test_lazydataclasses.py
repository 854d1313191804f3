"""Dataclass methods compiled at first call (``lazydataclasses``, installed by ``cli.main``):
every kind of dataclass behaves as ``dataclasses`` makes it, errors included. Checked in a
fresh interpreter: installing changes the process's ``dataclasses`` module."""

from __future__ import annotations

import subprocess
import sys

_CHECK = r'''
import dataclasses, sys
from dataclasses import FrozenInstanceError, InitVar, dataclass, field
from diskguard.lazydataclasses import install

assert install() is (sys.version_info[:2] == (3, 11))
assert install() is (sys.version_info[:2] == (3, 11))  # twice: once

@dataclass(frozen=True)
class Frozen:
    """A frozen record."""
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()
    d: list[int] = field(default_factory=list)

@dataclass(order=True)
class Ordered:
    """Ordered, mutable."""
    k: int
    v: str = field(default="", compare=False)

@dataclass
class Post:
    """With __post_init__ and an InitVar."""
    n: int
    scale: InitVar[int] = 2
    doubled: int = field(init=False, default=0)
    def __post_init__(self, scale):
        self.doubled = self.n * scale

@dataclass(frozen=True, slots=True, kw_only=True)
class Slotted:
    """Slots, keyword-only."""
    p: int
    q: int = 3

@dataclass(frozen=True)
class Child(Frozen):
    """A subclass."""
    e: int = 9

f = Frozen(1, c=(2,))
assert (f.a, f.b, f.c, f.d) == (1, "x", (2,), [])
assert f == Frozen(1, "x", (2,), []) and f != Frozen(2)
assert hash(f.__class__(1, "x", (2,), ())) == hash((1, "x", (2,), ()))
assert repr(Frozen(1, d=[])) == "Frozen(a=1, b='x', c=(), d=[])"
for attempt in (lambda: setattr(f, "a", 2), lambda: delattr(f, "a")):
    try:
        attempt()
    except FrozenInstanceError:
        pass
    else:
        raise AssertionError("a frozen dataclass took a change")
try:
    Frozen()
except TypeError as exc:
    assert "missing 1 required positional argument: 'a'" in str(exc), exc
else:
    raise AssertionError("a missing argument was taken")
assert Frozen.__init__.__qualname__ == "Frozen.__init__"
assert Frozen.__repr__.__module__ == Frozen.__module__
assert sorted([Ordered(3, "c"), Ordered(1, "a")]) == [Ordered(1, "z"), Ordered(3, "q")]
assert Ordered(1) < Ordered(2) and not Ordered(2) <= Ordered(1)
p = Post(4)
assert (p.n, p.doubled) == (4, 8) and Post(4, 3).doubled == 12
s = Slotted(p=1)
assert (s.p, s.q) == (1, 3) and not hasattr(s, "__dict__")
assert dataclasses.replace(s, q=5) == Slotted(p=1, q=5)
try:
    Slotted(1)
except TypeError:
    pass
else:
    raise AssertionError("kw_only took a positional argument")
c = Child(1, e=2)
assert (c.a, c.e) == (1, 2) and c != Frozen(1) and repr(c).startswith("Child(a=1")
assert dataclasses.asdict(c) == {"a": 1, "b": "x", "c": (), "d": [], "e": 2}
assert len({Frozen(1, d=()), Frozen(1, d=())}) == 1  # type: ignore[arg-type]
try:
    hash(f)  # a list field: unhashable, as dataclasses makes it
except TypeError:
    pass
else:
    raise AssertionError("hashed a list")
print("ok")
'''


def test_dataclasses_behave_as_made_when_their_methods_compile_late() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-3000:]
