"""The package's layout is part of the design (issue 14): these hold it there.

- every subpackage says in its ``__init__`` docstring what it is for and what it may import,
  and the README's "Where things are" map lists exactly the subpackages that exist;
- no module grows past ~400 lines unless its docstring says why (a line starting "Size:").
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "daemon" / "diskguard"
MAX_LINES = 420

SUBPACKAGES = sorted(
    p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
)


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "data" not in p.parts)


def test_every_subpackage_says_what_it_is_for() -> None:
    for name in SUBPACKAGES:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert doc and len(doc) > 60, f"diskguard/{name}/__init__.py needs its docstring"


def test_readme_map_matches_the_tree() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Where things are", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`diskguard/([a-z_]+)/`", section))
    assert listed == set(SUBPACKAGES)
    for path in re.findall(r"`(diskguard/[a-z_/]+\.py)`", section):
        assert (REPO / "daemon" / path).is_file(), f"README map names {path}, not in the tree"


@pytest.mark.parametrize("module", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_long_without_a_reason(module: Path) -> None:
    text = module.read_text()
    lines = text.count("\n")
    if lines <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert re.search(r"^Size:", doc, re.M), (
        f"{module.relative_to(REPO)} has {lines} lines: split it, or say why at its top "
        "in a docstring line starting 'Size:'"
    )
