"""The installable artifact: ``python -m build`` → sdist + wheel → a fresh venv → the CLI.

The wheel is installed with a plain ``pip install WHEEL`` into a new ``python -m venv``:
pip resolves every dependency from the configured index exactly as an operator's install
would (no ``--no-deps``, no borrowed site-packages, so a missing or wrong dependency pin
fails here). It is not slow because pip's cache already holds what ``make venv`` downloaded
(pyspark's locally built wheel above all): about 40 s here. The source tree is copied first
so that the build's egg-info/build dirs never land in the checkout.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

import diskguard
from diskguard.cli import cli

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config" / "diskguard.toml"
UNIT = REPO / "systemd" / "diskguard.service"
TIMEOUT_S = 300


def test_package_data_is_the_repository_files() -> None:
    """One source: diskguard/data/* are links to the files README tells operators to copy."""
    data = REPO / "daemon" / "diskguard" / "data"
    for name, target in (("diskguard.toml", CONFIG), ("diskguard.service", UNIT)):
        assert (data / name).is_symlink(), name
        assert (data / name).resolve() == target.resolve(), name


def test_example_commands_print_the_shipped_files() -> None:
    runner = CliRunner()
    for command, source in (("example-config", CONFIG), ("example-unit", UNIT)):
        result = runner.invoke(cli, [command])
        assert result.exit_code == 0, result.output
        assert result.output == source.read_text(), command


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path
    venv: Path


def _copy_source(dest: Path) -> Path:
    skip = shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", ".mypy_cache"
    )
    # symlinks=True: the package data links must survive as links, as in a checkout.
    shutil.copytree(REPO, dest, ignore=skip, symlinks=True)
    return dest


def _env_without_checkout() -> dict[str, str]:
    """The test's PYTHONPATH points at the checkout; the venv must see only the wheel."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _copy_source(tmp / "src")
    dist = tmp / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")

    venv = tmp / "venv"
    env = _env_without_checkout()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=TIMEOUT_S)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
    )
    assert install.returncode == 0, install.stderr[-4000:]
    try:
        yield Built(sdist, wheel, venv)
    finally:
        # ~750 MB (pyspark): do not leave it in pytest's kept temp dirs
        shutil.rmtree(venv, ignore_errors=True)


def _wheel_version(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return str(email.message_from_bytes(z.read(name))["Version"])


def _run(built: Built, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(built.venv / "bin" / "diskguard"), *args],
        capture_output=True,
        text=True,
        env=_env_without_checkout(),
        cwd=built.venv,  # not the checkout: nothing importable from the cwd
        timeout=TIMEOUT_S,
    )


def test_the_wheel_holds_only_product_code(built: Built) -> None:
    """Exactly the package's modules: no demo, no test helpers, every subpackage there."""
    package = REPO / "daemon" / "diskguard"
    expected = {
        "diskguard/" + str(p.relative_to(package))
        for p in package.rglob("*.py")
        if "__pycache__" not in p.parts
    }
    with zipfile.ZipFile(built.wheel) as z:
        names = z.namelist()
    assert {n for n in names if n.endswith(".py")} == expected
    assert {n.split("/")[0] for n in names} <= {"diskguard", f"{_dist_info(names)}"}


def _dist_info(names: list[str]) -> str:
    (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    return info


def test_artifacts_carry_the_example_config_and_unit(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as z:
        assert z.read("diskguard/data/diskguard.toml") == CONFIG.read_bytes()
        assert z.read("diskguard/data/diskguard.service") == UNIT.read_bytes()
        assert "diskguard/py.typed" in z.namelist()
    with tarfile.open(built.sdist) as t:
        members = {m.name.split("/", 1)[1]: m for m in t.getmembers() if "/" in m.name}
        for inside, source in (
            ("daemon/diskguard/data/diskguard.toml", CONFIG),
            ("daemon/diskguard/data/diskguard.service", UNIT),
        ):
            assert members[inside].isfile(), inside  # contents, not a dangling link
            f = t.extractfile(members[inside])
            assert f is not None
            assert f.read() == source.read_bytes(), inside


def test_installed_cli_runs_from_the_wheel(built: Built) -> None:
    where = subprocess.run(
        [str(built.venv / "bin" / "python"), "-c", "import diskguard; print(diskguard.__file__)"],
        capture_output=True,
        text=True,
        env=_env_without_checkout(),
        cwd=built.venv,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(built.venv), where.stdout


def test_version_is_the_wheels_metadata(built: Built) -> None:
    version = _wheel_version(built.wheel)
    assert version == diskguard.__version__
    assert built.wheel.name.startswith(f"kafka_diskguard-{version}-")
    result = _run(built, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"diskguard, version {version}"


def test_check_config_on_the_shipped_example(built: Built, tmp_path: Path) -> None:
    shown = _run(built, "example-config")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == CONFIG.read_text()
    unit = _run(built, "example-unit")
    assert unit.returncode == 0, unit.stderr
    assert unit.stdout == UNIT.read_text()

    example = tmp_path / "diskguard.toml"
    example.write_text(shown.stdout)
    # As shipped it names /var/lib/kafka/data, which this machine does not have: one line, 2.
    assert not Path("/var/lib/kafka/data").exists()
    bad = _run(built, "check-config", "-c", str(example))
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"{example}: broker.log_dirs[0]: log dir /var/lib/kafka/data does not exist or is not"
        " a directory"
    ]
    assert "Traceback" not in bad.stderr

    log_dir = tmp_path / "kafka-data"
    log_dir.mkdir()
    edited = shown.stdout.replace('"/var/lib/kafka/data"', f'"{log_dir}"')
    assert edited != shown.stdout
    example.write_text(edited)
    good = _run(built, "check-config", "-c", str(example))
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() == f"{example}: ok (1 log dir: {log_dir})"
