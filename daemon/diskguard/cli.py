"""The ``diskguard`` command line: the command list, and what every command shares.

Every command validates the config the same way before doing anything (exit 2 with one line
per problem), and no command ever shows a traceback: a :class:`~diskguard.errors.DiskguardError`
becomes its one line and its exit code, anything unexpected one line and exit 1.

The commands are listed once, in :data:`COMMANDS`, and imported only when run: ``diskguard
plan`` does not pay for the Spark job, the daemon loop or the Kafka clients. Nor does this
module import the config: the command's modules do, with the cyclic garbage
collector paused (start-up time, see :func:`collector_paused`).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from diskguard import __version__
from diskguard.errors import ConfigError, DiskguardError, ExitCode

if TYPE_CHECKING:
    from diskguard.config import Config

F = TypeVar("F", bound=Callable[..., Any])


#: Set by :func:`main`: this process is a ``diskguard`` command, not a test or a library user.
_COMMAND_PROCESS = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a command's modules load.

    Importing click, the config and a command's modules creates tens of thousands of objects that
    live as long as the process; the collector's passes over them free nothing and cost milliseconds
    of every one-shot command (~10 ms when the config was pydantic's). In a command's own process
    they are then frozen (``gc.freeze``), so that later collections skip them instead of traversing
    them all again; elsewhere (tests, library use) the collector is only resumed. A one-shot
    ``plan`` runs whole under it: what it makes lives until it exits.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if _COMMAND_PROCESS:
            gc.freeze()
        gc.enable()


def fail(message: str, code: int = ExitCode.USAGE) -> NoReturn:
    """One line on stderr, then exit: the only way a command reports a problem."""
    click.echo(f"diskguard: {message}", err=True)
    sys.exit(code)


def load_or_exit(path: Path, writes: bool = True) -> Config:
    """The validated config, with logging set up on stderr at its level: a command's answer
    owns stdout (``plan --json`` must parse even when the broker is down and says so). The
    daemon and ``enforce`` switch their JSON event stream to stdout themselves. ``writes=False``
    for commands that only read the state dir: it need not be writable by this user."""
    with collector_paused():
        from diskguard.config import load_config
        from diskguard.logs import configure_logging
    try:
        config = load_config(path, writes)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(problem, err=True)
        sys.exit(ExitCode.USAGE)
    configure_logging(config.logging.format, config.logging.level, stream=sys.stderr)
    return config


def config_option(func: F) -> F:
    from diskguard.config import DEFAULT_CONFIG_PATH

    return click.option(
        "-c",
        "--config",
        "config_path",
        # A directory (or a FIFO, a device...) is refused by ``load_config`` in one line,
        # as every other unreadable config is; click's own check would print three.
        type=click.Path(path_type=Path),
        default=DEFAULT_CONFIG_PATH,
        show_default=True,
        help="The diskguard TOML config.",
    )(func)


def no_traceback(func: F) -> F:
    """Turn any unexpected exception into one line and exit 1; click's own exits pass through."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, SystemExit, KeyboardInterrupt):
            raise
        except DiskguardError as exc:
            fail(str(exc), exc.exit_code)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}", ExitCode.FAILED)
        except Exception as exc:
            fail(f"unexpected error: {type(exc).__name__}: {exc}", ExitCode.FAILED)

    return wrapper  # type: ignore[return-value]


#: Every command: name -> "module:attribute" under diskguard.commands. The one list.
COMMANDS: dict[str, str] = {
    "aggregate": "aggregate:aggregate_command",
    "audit": "audit:audit_command",
    "ballast": "ballast:ballast_group",
    "check-config": "check_config:check_config",
    "enforce": "enforce:enforce_command",
    "example-config": "examples:example_config",
    "example-unit": "examples:example_unit",
    "plan": "plan:plan_command",
    "reserve": "reserve:reserve",
    "run": "run:run_command",
    "status": "status:status_command",
}


class _Commands(click.Group):
    """A click group whose commands come from :data:`COMMANDS`, imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        with collector_paused():
            command = getattr(import_module(f"diskguard.commands.{module}"), attr)
        if not isinstance(command, click.Command):  # pragma: no cover - a wrong COMMANDS line
            raise TypeError(f"COMMANDS[{cmd_name!r}] is not a click command: {target}")
        return command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="diskguard")
def cli() -> None:
    """Keeps a Kafka broker's disks from filling (KIP-61 retention, flow control, snapshots)."""


def write_out(text: bytes) -> None:
    """``text`` and a newline to stdout, as bytes where stdout has them (ASCII: the same
    bytes its text layer would write), after what that layer holds."""
    sys.stdout.flush()
    raw = getattr(sys.stdout, "buffer", None)
    if raw is None:
        sys.stdout.write(text.decode("ascii") + "\n")
        sys.stdout.flush()
        return
    raw.write(text)
    raw.write(b"\n")
    raw.flush()


def leaves_at_once() -> bool:
    """Will ``leave_process`` end this process (a command's own, not a test's)?"""
    return _COMMAND_PROCESS


def leave_process() -> None:
    """End a one-shot command's own process now, its output written: exit 0 without freeing.

    Returning would free every object the command made, one by one: a plan of 10,000
    deletions over 1,000 partitions holds ~300,000, ~10 ms of a 0.3 s ``plan --json`` for
    memory the kernel takes back whole. Output is flushed first (a flush that
    fails raises as usual) and the exit handlers run (logging's flush among them): only the
    freeing is skipped. Only in the command's own process (``main``): under a test or a
    library caller this returns, and the command ends as usual.
    """
    if not _COMMAND_PROCESS:
        return
    import atexit

    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(ExitCode.OK)


def main() -> None:
    """The command line (``launch.main``, the console script's entry point, runs it)."""
    global _COMMAND_PROCESS
    _COMMAND_PROCESS = True
    # Before any command module makes its dataclasses: their methods compile at first call
    # (not for the Spark job, see the module).
    if "aggregate" not in sys.argv[1:]:
        from diskguard.lazydataclasses import install

        install()
    cli(prog_name="diskguard")
