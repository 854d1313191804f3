"""The CLI's one command list (``diskguard.cli.COMMANDS``) and what running a command loads.

Commands are registered explicitly, in one list, and imported only when run: a module left
out of the list would be a command nobody can reach, an entry without its module a command
that crashes; and ``diskguard plan`` must not pay for Spark, the daemon loop or the fleet job.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import click
import pytest

import diskguard.commands
from diskguard.cli import COMMANDS, cli


def test_every_command_module_is_listed_and_every_entry_resolves() -> None:
    modules = {m.name for m in pkgutil.iter_modules(diskguard.commands.__path__)}
    listed = {target.partition(":")[0] for target in COMMANDS.values()}
    assert modules == listed
    ctx = click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert isinstance(command, click.Command)
        assert command.name == name
    assert cli.list_commands(ctx) == sorted(COMMANDS)
    assert cli.get_command(ctx, "no-such-command") is None


def _loaded_by(command: str) -> set[str]:
    code = (
        "import json, sys; from diskguard.cli import cli; import click; "
        f"cli.get_command(click.Context(cli), {command!r}); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out))


@pytest.mark.parametrize("command", ["plan", "status", "check-config", "audit", "enforce"])
def test_a_command_loads_only_what_it_uses(command: str) -> None:
    loaded = _loaded_by(command)
    for heavy in ("pyspark", "diskguard.daemon", "diskguard.sparkjob", "diskguard.fleet.report"):
        assert not any(m == heavy or m.startswith(heavy + ".") for m in loaded), (command, heavy)
    others = {f"diskguard.commands.{t.partition(':')[0]}" for t in COMMANDS.values()}
    mine = f"diskguard.commands.{COMMANDS[command].partition(':')[0]}"
    assert (loaded & others) == {mine}
