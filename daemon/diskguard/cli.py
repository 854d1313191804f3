"""The ``diskguard`` command line.

Every command validates the config the same way before doing anything (exit 2 with one line
per problem), and no command ever shows a traceback: unexpected errors are reported as one
line and exit 1.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from diskguard import __version__
from diskguard.config import DEFAULT_CONFIG_PATH, Config, ConfigError, load_config
from diskguard.logs import configure_logging
from diskguard.units import plural

EXIT_OK = 0
EXIT_UNREACHABLE = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """One line on stderr, then exit: the only way a command reports a problem."""
    click.echo(f"diskguard: {message}", err=True)
    sys.exit(code)


def load_or_exit(path: Path, writes: bool = True) -> Config:
    """The validated config, with logging set up on stderr at its level: a command's answer
    owns stdout (``plan --json`` must parse even when the broker is down and says so). The
    daemon and ``enforce`` switch their JSON event stream to stdout themselves. ``writes=False``
    for commands that only read the state dir: it need not be writable by this user."""
    try:
        config = load_config(path, writes)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(problem, err=True)
        sys.exit(EXIT_USAGE)
    configure_logging(config.logging.format, config.logging.level, stream=sys.stderr)
    return config


def config_option(func: F) -> F:
    return click.option(
        "-c",
        "--config",
        "config_path",
        type=click.Path(path_type=Path, dir_okay=False),
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
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}", EXIT_UNREACHABLE)
        except Exception as exc:
            fail(f"unexpected error: {type(exc).__name__}: {exc}", EXIT_UNREACHABLE)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="diskguard")
def cli() -> None:
    """Keeps a Kafka broker's disks from filling (KIP-61 retention, flow control, snapshots)."""


@cli.command("check-config")
@config_option
@click.option(
    "--connect",
    is_flag=True,
    help="Also reach the broker and check what each configured feature needs.",
)
@no_traceback
def check_config(config_path: Path, connect: bool) -> None:
    """Validate the config: exit 0 when valid, 2 with one line per problem otherwise.

    With --connect: reach the broker, learn its reclaim latency and the headroom the disks
    need at the current write rate; exit 2 when a configured feature cannot work.
    """
    config = load_or_exit(config_path)
    dirs = ", ".join(str(d) for d in config.broker.log_dirs)
    count = plural(len(config.broker.log_dirs), "log dir")
    click.echo(f"{config_path}: ok ({count}: {dirs})")
    if not connect:
        return
    from diskguard.connectcheck import connect_checks

    checks = connect_checks(config)
    for check in checks:
        click.echo(f"{'ok' if check.ok else 'FAIL'}: {check.line}")
    if not all(check.ok for check in checks):
        sys.exit(EXIT_USAGE)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="diskguard")


# Subcommands live beside the code they drive; importing registers them on ``cli``.
from diskguard import commands as _commands  # noqa: E402,F401
