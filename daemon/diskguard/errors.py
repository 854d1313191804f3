"""Exit codes and the errors that carry them (borg's ``helpers/errors.py`` is the model).

One table of exit codes for every command and the Spark job, and one rule: an error raised
anywhere below a command says which code it means; the CLI turns it into one line on stderr
and that exit code (``cli.no_traceback``). Pure: imports nothing.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a ``diskguard`` process's exit status means (README "Exit codes")."""

    #: Done; the disks are at or under their limits.
    OK = 0
    #: Something could not be done: a broker or file unreachable, a deletion failed, a disk
    #: still over its limit, an unexpected error.
    FAILED = 1
    #: Bad usage or input: a config problem, a bad option, an input that cannot be read.
    USAGE = 2
    #: Refused for safety: deleting would need a broker that is not there (or a log dir lock
    #: that cannot be probed), a ballast that is not ours.
    REFUSED = 3


class DiskguardError(Exception):
    """Base of every error meant for the operator: ``str(exc)`` is the one line to show."""

    exit_code: ExitCode = ExitCode.FAILED


class UsageError(DiskguardError):
    """Bad input: a config key, an option, a file the user named."""

    exit_code = ExitCode.USAGE


class FailedError(DiskguardError):
    """It could not be done (unreachable, failed); trying again later may work."""

    exit_code = ExitCode.FAILED


class RefusedError(DiskguardError):
    """Refused because doing it could be unsafe."""

    exit_code = ExitCode.REFUSED


class ConfigError(UsageError):
    """The config is invalid; carries every problem as one line each (all shown, then exit 2)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
