"""The package's layout is part of the design (issue 14): these hold it there.

- every subpackage says in its ``__init__`` docstring what it is for and what it may import,
  and the README's "Where things are" map lists exactly the subpackages that exist;
- no module grows past ~400 lines unless its docstring says why (a line starting "Size:");
- a subpackage imports only the layers its ``__init__`` names (``ALLOWED`` below mirrors them).
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


def test_every_nested_package_says_what_it_is_for_and_is_in_the_readme() -> None:
    """A package inside a subpackage (``retention/offline/``) says what it is too, and the
    README's map names it."""
    readme = (REPO / "README.md").read_text()
    nested = sorted(
        p.parent.relative_to(PACKAGE)
        for p in PACKAGE.glob("*/*/__init__.py")
        if "data" not in p.parts
    )
    assert nested, "no nested package found: the test would hold nothing"
    for package in nested:
        doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
        assert doc and len(doc) > 60, f"diskguard/{package}/__init__.py needs its docstring"
        assert f"diskguard/{package}/" in readme, f"README's map does not name {package}"


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


#: What each subpackage may import from the rest of diskguard (its ``__init__`` says the same).
#: A dotted entry allows that one module only: plain data crossing a layer, not its I/O.
ALLOWED: dict[str, set[str]] = {
    "host": {"kafkalog.model"},
    "kafkalog": {"host", "errors", "properties"},
    "broker": {"logs", "retention.planner"},
    "capacity": {"config", "errors", "kafkalog", "logs", "host"},
    "retention": {
        "broker",
        "capacity",
        "config",
        "configschema",
        "errors",
        "host",
        "kafkalog",
        "logs",
        "units",
    },
    "flow": {
        "config",
        "host",
        "kafkalog",
        "logs",
        "errors",
        "units",
        "broker.errors",
        "broker.kafkapython",
    },
    "snapshots": {"broker", "host", "kafkalog", "logs"},
    "fleet": {"errors", "units", "properties"},
    "daemon": {
        "config",
        "errors",
        "flow",
        "host",
        "kafkalog",
        "logs",
        "metrics",
        "retention",
        "snapshots",
        "units",
    },
}


def _imports(module: Path) -> set[str]:
    """Every ``diskguard.x[.y]`` a module imports, as ``x.y`` (from-imports of names too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diskguard"):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("diskguard")]
        found.update(".".join(n.split(".")[1:3]) for n in names if n.count(".") >= 1)
    return found


@pytest.mark.parametrize("sub", sorted(ALLOWED))
def test_a_subpackage_imports_only_its_allowed_layers(sub: str) -> None:
    wrong = []
    for module in sorted((PACKAGE / sub).rglob("*.py")):
        for target in _imports(module):
            top = target.split(".")[0]
            is_module = (PACKAGE / f"{top}.py").exists() or (PACKAGE / top).is_dir()
            if top == sub or not is_module:
                continue
            if top in ALLOWED[sub] or target in ALLOWED[sub]:
                continue
            wrong.append(f"{module.relative_to(PACKAGE)} imports diskguard.{target}")
    assert wrong == []


def test_every_subpackage_has_its_layer_rule() -> None:
    assert set(ALLOWED) | {"commands"} == set(SUBPACKAGES)


def test_no_module_cites_an_issue_number() -> None:
    """The code's readers do not have the tracker: a comment says the reason itself, never
    "issue 15" (the numbers live in commit messages and docs/)."""
    cited = re.compile(r"\bissues?\s*(?:#\s*)?\d+", re.I)
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*"))
        if path.is_file() and path.suffix in (".py", ".toml", ".service")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if cited.search(line)
    ]
    assert found == []
