"""The CLI's one command list (``diskguard.cli.COMMANDS``) and what running a command loads.

Commands are registered explicitly, in one list, and imported only when run: a module left
out of the list would be a command nobody can reach, an entry without its module a command
that crashes; and ``diskguard plan`` must not pay for Spark, the daemon loop or the fleet job.

Nor for what issue 15 took out of every one-shot command's start-up: structlog (and rich,
asyncio through it) until something is logged, rich for ``--json``, importlib.metadata
(crc32c's version; pydantic itself is gone), the retention cycle for ``status``, the
reserve report's modules (``diskguard.capacity``) and gzip. Checked
by running the commands in a fresh interpreter, so a new top-level import cannot bring them
back unnoticed; no timing is asserted.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

import diskguard.commands
from diskguard.cli import COMMANDS, cli
from support.configs import write_config


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


def _loaded_running(args: list[str], tmp: Path) -> set[str]:
    """The modules loaded once ``diskguard ARGS`` has run (exit 0) in a fresh interpreter."""
    dump = tmp / "modules.json"
    code = (
        "import atexit, json, sys\n"
        "def dump():\n"
        f"    with open({str(dump)!r}, 'w') as out:\n"
        "        out.write(json.dumps(sorted(sys.modules)))\n"
        "atexit.register(dump)\n"
        f"sys.argv = ['diskguard', *{args!r}]\n"
        "from diskguard.cli import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return set(json.loads(dump.read_text()))


#: Never loaded by the start-up of plan --json / status --json / check-config.
_NOT_AT_STARTUP = (
    "pydantic",
    "structlog",
    "rich",
    "pygments",
    "asyncio",
    "importlib.metadata",
    "crc32c",
    "diskguard.capacity",
    "gzip",
)


@pytest.mark.parametrize(
    "args", [["plan", "--json"], ["status", "--json"], ["check-config"]], ids=" ".join
)
def test_one_shot_commands_start_without_the_heavy_imports(args: list[str], tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    config = write_config(tmp_path, tmp_path / "logs")
    loaded = _loaded_running([*args, "-c", str(config)], tmp_path)
    assert "diskguard.configschema" in loaded  # the config was validated as always
    status_skips = ("diskguard.retention.cycle", "diskguard.retention.planner", "diskguard.broker")
    heavy = status_skips if args[0] == "status" else ()
    for name in (*_NOT_AT_STARTUP, *heavy):
        assert not any(m == name or m.startswith(name + ".") for m in loaded), (args, name)


def test_a_logged_event_still_loads_structlog_and_renders_as_configured(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from diskguard.logs import configure_logging, get_logger\n"
        "log = get_logger('diskguard.test')\n"
        "configure_logging('json', 'info', stream=sys.stderr)\n"
        "assert 'structlog' not in sys.modules\n"
        "log.debug('below_the_level')\n"
        "assert 'structlog' not in sys.modules\n"  # an event filtered out imports nothing
        "log.warning('something_happened', n=1)\n"
        "log.debug('below_the_level_after')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout == ""
    (event,) = [json.loads(line) for line in proc.stderr.splitlines()]
    assert event["event"] == "something_happened" and event["level"] == "warning"
    assert event["component"] == "diskguard.test" and event["n"] == 1
