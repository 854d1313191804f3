"""``plan``'s worker forked at the command's first moment, listing before the config is checked.

Why: a warm ``plan`` of a large log dir is its listing and its walk on two cores, and the
worker (``host.forked.Worker``) forked once the config was loaded started listing ~85 ms
into a ~0.4 s command: the interpreter, click, the command's modules and the config came
first, on one core, while the other had nothing to do. Forked before any of that
(:func:`start`, from ``launch.main``), the worker reads the config file's ``broker.log_dirs``
itself, finds their live partition dirs as the scan will and lists them from the first on,
sending their paths first. What the command then validates is the authority: its worker's
listing is taken (:func:`take`) only where those paths are exactly the ones the checked
config's log dirs hold now (``ListingCache.live_paths``) and the plan lists names only;
anywhere else (another spelling, ``server.properties`` naming the log dirs, a dir made or
removed meanwhile, a byte budget, an unreadable file) the worker is sent the usual request
and nothing it listed is used. Listing reads names only, so a guess costs time, never a
different plan. Below ``MIN_DIRS`` dirs the command lists them itself, as it always did,
without waiting for the worker.

Only for the plain ``plan [-c PATH] [--json]`` command line (click would read it the same
way); anything else (``--help``, an option given twice) starts the worker where it always did.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from diskguard.host.forked import ChildFailed, Claims, Worker, WorkStream

if TYPE_CHECKING:
    from diskguard.config import Config
    from diskguard.kafkalog.listing import ListingCache

__all__ = ["DATE_AHEAD", "MIN_DIRS", "config_path", "listed_from_config", "start", "take"]

#: What the worker does once it has listed its share: date those partitions' heads ahead of
#: the walk (named, not imported: the planner's modules load after the fork).
DATE_AHEAD = ("diskguard.retention.parallelheads", "date_ahead")
#: The claims' count until the worker has found its dirs (``Claims.end_at``).
_UNKNOWN = 1 << 62
#: ``config.DEFAULT_CONFIG_PATH`` and ``config.MAX_CONFIG_BYTES`` (a test holds them equal):
#: importing the config's modules before the fork would cost what forking first saves.
DEFAULT_CONFIG = "/etc/diskguard/diskguard.toml"
#: ``config.DaemonConfig``'s default ``state_dir`` (held equal by the same test).
DEFAULT_STATE_DIR = "/var/lib/diskguard"
_CONFIG_LIMIT = 1024 * 1024
#: ``parallellisting.MIN_DIRS`` (held equal by the same test): fewer dirs are listed by the
#: command itself.
MIN_DIRS = 256

#: The worker started by ``start`` and its listing, until ``take``.
_started: tuple[Worker, WorkStream] | None = None


def config_path(args: Sequence[str]) -> str | None:
    """The config path of ``plan``'s arguments ``args`` as click reads them (``-c PATH``,
    ``-cPATH``, ``--config PATH``, ``--config=PATH``, ``--json``), the default where none is
    given; None for any other command line."""
    path: str | None = None
    given = 0
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--json":
            pass
        elif arg in ("-c", "--config"):
            if i + 1 >= len(args):
                return None
            path, given, i = args[i + 1], given + 1, i + 1
        elif arg.startswith("--config="):
            path, given = arg[len("--config=") :], given + 1
        elif arg.startswith("-c") and not arg.startswith("--"):
            path, given = arg[2:], given + 1
        else:
            return None
        i += 1
    if given > 1 or path == "":
        return None
    return DEFAULT_CONFIG if path is None else path


def start(args: Sequence[str], force: bool = False) -> None:
    """``plan``'s worker forked now and listing the dirs of the config ``args`` name
    (``launch.main``, before anything else is loaded); nothing where the command line is
    another or no fork is safe or possible (``force``: fork all the same, for tests)."""
    global _started
    path = config_path(args)
    if path is None or _started is not None:
        return
    worker = Worker.start(force)
    if worker is None:
        return
    # A command that ends before its plan (a config refused) leaves no child behind.
    atexit.register(worker.close, False)
    try:
        stream = worker.stream(listed_from_config, path, DATE_AHEAD, claims=_UNKNOWN)
    except ChildFailed:
        worker.close(reap=False)
        return
    _started = (worker, stream)


def take(config: Config, full: bool) -> tuple[Worker, ListingCache] | None:
    """The worker ``start`` forked and a listing cache with its listing (``full``: stat every
    file, which the worker did not: it is asked again), or None where none was started. The
    worker's dirs must be the checked config's, as the scan will list them; else it is sent
    the usual request (``ListingCache.start_early``)."""
    global _started
    started, _started = _started, None
    if started is None:
        return None
    from diskguard.kafkalog.listing import ListingCache
    from diskguard.kafkalog.parallellisting import EarlyListing

    worker, stream = started
    cache = ListingCache(worker=worker)
    log_dirs = [os.fspath(d) for d in config.broker.log_dirs]
    paths = cache.live_paths(log_dirs)
    theirs: Any = None
    # Below ``MIN_DIRS`` this process lists them itself, as it would have: it does not wait
    # for the worker's first word (its imports, on a busy machine ~0.1 s of a small plan).
    if not full and len(paths) >= MIN_DIRS:
        try:
            theirs = next(iter(stream), None)
        except (OSError, ChildFailed):
            theirs = None
    if theirs == paths:
        cache.take_early(EarlyListing(paths, full, stream))
    else:
        stream.close()
        cache.start_early(log_dirs, full, DATE_AHEAD)
    return worker, cache


def listed_from_config(path: str, then: tuple[str, str] | None, claims: Claims) -> Iterator[Any]:
    """The worker's side: the live partition dirs of the log dirs the config file ``path``
    names, as the checked config spells them (real paths), first as one list, then each
    listed as ``parallellisting.listed_plain`` does from the first on. Nothing where they
    are too few for the command to take them (``take``): a small plan's worker loads nothing
    more (its imports took the core a busy machine's command needed)."""
    log_dirs, state_dir = _from_config(path)
    if sum(_subdirs(d) for d in log_dirs) < MIN_DIRS:
        return
    from diskguard.lazydataclasses import install

    install()  # the command's process does too (``cli.main``): the listing's modules load here
    from diskguard.kafkalog import listingstore
    from diskguard.kafkalog.listing import live_partition_dirs, log_dir_entries
    from diskguard.kafkalog.parallellisting import listed_plain, use_store

    paths: list[str] = []
    for log_dir in log_dirs:
        try:
            paths.extend(live_partition_dirs(log_dir_entries(log_dir)))
        except OSError:
            continue  # as ``ListingCache.live_paths``: the scan says why
    claims.end_at(len(paths))
    yield paths
    # What the last plan listed (after the paths: the command may be waiting for them): a
    # dir unchanged since is not listed again. Kept in the state dir the file names (the
    # command saves there: ``plan``); another is no store, never a different listing (each
    # dir's own ``stat`` decides).
    use_store(listingstore.load(state_dir))
    yield from listed_plain(paths, False, then, claims)


def _subdirs(log_dir: str) -> int:
    """How many directories ``log_dir`` holds (at least its live partition dirs)."""
    try:
        with os.scandir(log_dir) as entries:
            return sum(1 for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return 0


def _from_config(path: str) -> tuple[list[str], str]:
    """``broker.log_dirs`` of the TOML file ``path`` as the checked config resolves them ([]
    where they are not simply given there), and its ``daemon.state_dir``."""
    import tomllib

    from diskguard.host import safeopen

    data = tomllib.loads(safeopen.read_bytes(path, limit=_CONFIG_LIMIT, follow=True).decode())
    daemon = data.get("daemon")
    state_dir = daemon.get("state_dir") if isinstance(daemon, dict) else None
    if not isinstance(state_dir, str):
        state_dir = DEFAULT_STATE_DIR
    broker = data.get("broker")
    dirs = broker.get("log_dirs") if isinstance(broker, dict) else None
    if not isinstance(dirs, list) or not all(isinstance(d, str) and os.path.isabs(d) for d in dirs):
        return [], state_dir
    return [os.path.realpath(d) for d in dirs], state_dir
