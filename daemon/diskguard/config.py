"""The one TOML file: loaded, validated and typed before any command does anything.

Every problem is reported as one line ``FILE: key.path: what is wrong`` so that an operator
fixing a config at 3 a.m. sees all problems at once, not one per restart. Unknown keys are
errors: a misspelt ``disk_usage_persent`` silently falling back to "off" is the worst
possible failure for a guard.
"""

# No ``from __future__ import annotations`` here: configschema reads each field's annotation
# as an object (a string would have to be evaluated).
import dataclasses
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from diskguard.configcheck import inside_log_dir, program_problem, state_dir_problem
from diskguard.configschema import Problem, build, dotted
from diskguard.errors import ConfigError
from diskguard.host import safeopen
from diskguard.kafkalog.serverprops import read_server_properties
from diskguard.units import parse_duration, parse_size

DEFAULT_CONFIG_PATH = Path("/etc/diskguard/diskguard.toml")
#: A config is a few KiB (the complete example is ~10 KiB): a larger "config" is a wrong path.
MAX_CONFIG_BYTES = 1024 * 1024


def _percent(value: object) -> float:
    """A percentage of a disk: a number in (0, 100]. TOML ``true`` is not a number (read as 1
    it would make ``disk_usage_percent = true`` mean 1 %, and every deletable segment go); a
    number in quotes is read as the number."""
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"expected a number, got {value!r:.40}") from None
    if not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if not value > 0:  # also NaN
        raise ValueError(f"must be greater than 0, got {value!r:.40}")
    if not value <= 100:
        raise ValueError(f"must be at most 100, got {value!r:.40}")
    return float(value)


def _at_least(floor: str) -> Callable[[float], float]:
    """A duration floor: an interval of 0 makes the daemon loop spin instead of sleep."""
    seconds = parse_duration(floor)

    def check(value: float) -> float:
        if value < seconds:
            raise ValueError(f"must be at least {floor}")
        return value

    return check


def _a_rate(value: int) -> int:
    if value < 1:  # in whole bytes ("0.5" is 0): configschema's problem shows the "0.5"
        raise ValueError("must be a rate of at least 1 byte per second")
    return value


def _regexes(patterns: list[str]) -> list[str]:
    """Topic patterns compile now, not at the first cycle that reads them."""
    if not isinstance(patterns, list | tuple) or not all(isinstance(p, str) for p in patterns):
        raise ValueError("expected an array of strings (regular expressions)")
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
    return list(patterns)


def _host_port(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f'expected HOST:PORT such as "127.0.0.1:9309", got {value!r:.40}')
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f'expected HOST:PORT such as "127.0.0.1:9309", got {value!r}')
    return value


Size = Annotated[int, parse_size]
Duration = Annotated[float, parse_duration]
Percent = Annotated[float, _percent]
#: Floors (README's config table): below them a timer stops being a timer.
CheckInterval = Annotated[float, parse_duration, _at_least("100ms")]
PollInterval = Annotated[float, parse_duration, _at_least("10ms")]
SnapshotInterval = Annotated[float, parse_duration, _at_least("100ms")]
HookTimeout = Annotated[float, parse_duration, _at_least("100ms")]
#: Renewed every third of it: a shorter lease would expire on one slow broker round trip.
HoldLease = Annotated[float, parse_duration, _at_least("3s")]
Patterns = Annotated[list[str], _regexes]
HostPort = Annotated[str, _host_port]


@dataclass(frozen=True)
class BrokerConfig:
    log_dirs: list[Path] = field(default_factory=list)
    server_properties: Path | None = None
    bootstrap_servers: str | None = None
    client: dict[str, str | int | float | bool] = field(default_factory=dict)
    #: Used for the IBM reserved-size check and offline headroom when server.properties
    #: does not say; Kafka's own defaults.
    segment_bytes: Size = 1024**3
    segment_index_bytes: Size = 10 * 1024**2


@dataclass(frozen=True)
class RetentionConfig:
    disk_usage_percent: Percent = 100.0
    target_percent: Percent | None = None
    max_bytes: Size | None = None
    mode: Literal["auto", "broker", "offline", "dry-run"] = "auto"
    #: Regexes of topics never deleted, *in addition to* the internal topics (``__*``,
    #: ``_schemas``, ``_confluent-*``), which are always protected (``topicpolicy``).
    protect_topics: Patterns = field(default_factory=list)
    #: Regexes of topics the operator knows to be ``cleanup.policy=delete`` (or accepts to
    #: trim although ``compact,delete``) while diskguard cannot learn their policy.
    assume_delete_policy: Patterns = field(default_factory=list)
    check_interval: CheckInterval = 5.0
    #: How often the daemon re-reads each filesystem's usage (one statvfs, microseconds) between
    #: inotify hints: what keeps the reaction time under a second even when events are lost.
    usage_poll_interval: PollInterval = 0.25
    #: Offline rescue only: extra free space left for the broker's own log recovery
    #: (producer snapshots, checkpoints, index rebuilds write before it can serve).
    offline_headroom: Size = 256 * 1024**2
    #: Prefer, among equally old segments, those every consumer group has read.
    consumer_aware: bool = True

    def __post_init__(self) -> None:
        if self.target_percent is not None and self.target_percent > self.disk_usage_percent:
            raise ValueError(
                f"target_percent ({self.target_percent}) must not exceed "
                f"disk_usage_percent ({self.disk_usage_percent})"
            )

    @property
    def effective_target_percent(self) -> float:
        return self.disk_usage_percent if self.target_percent is None else self.target_percent


RateLimit = Annotated[int, parse_size, _a_rate]
StallAfter = Annotated[float, parse_duration, _at_least("1s")]


@dataclass(frozen=True)
class LadderConfig:
    """The lossless rungs climbed before any deletion (broker mode; README "How it decides")."""

    #: Rung 1: lower a tiered topic's local retention so the broker drops what is uploaded.
    tiered_eviction: bool = True
    #: Tiered topics the last rung may still delete (DeleteRecords deletes the remote copy
    #: too): regexes; none by default.
    delete_tiered_topics: Patterns = field(default_factory=list)
    #: A tiered partition holding closed segments not uploaded, with no upload progress for
    #: this long, is an alert of its own (``tiered_upload_stalled``).
    upload_stall_after: StallAfter = 600.0
    #: Rung 2 (Kafka 4.3+): a log dir at the first alert level is cordoned.
    cordon: bool = True
    #: Rung 3: move whole replicas from a full JBOD log dir to another disk with room.
    balance_log_dirs: bool = True
    #: The copy rate a move is planned with until one was measured (bytes per second).
    assumed_move_rate: RateLimit = 32 * 1024**2


@dataclass(frozen=True)
class QuotaConfig:
    """AlterClientQuotas entity and rate applied while overfull."""

    #: Kafka refuses 0 (AlterClientQuotas): said at start, not failed at every overfull.
    producer_byte_rate: RateLimit = 1024
    #: Entities as Kafka names them, e.g. ``{"user" = "alice"}`` or ``{"client-id" = "app"}``;
    #: empty = the default entity for users and client ids.
    entities: list[dict[str, str | None]] = field(default_factory=list)


@dataclass(frozen=True)
class FlowControlConfig:
    overfull_percent: Percent | None = None
    underfull_percent: Percent | None = None
    overfull_bytes: Size | None = None
    underfull_bytes: Size | None = None
    #: Hard floor on free space, like Redpanda's storage_min_free_bytes. None = min(5 GiB, 5%).
    min_free_bytes: Size | None = None
    on_change: list[str] = field(default_factory=list)
    on_change_timeout: HookTimeout = 30.0
    actuators: list[Literal["exec", "quota", "acl"]] = field(default_factory=list)
    quota: QuotaConfig = field(default_factory=QuotaConfig)
    #: ACL principal denied WRITE while overfull.
    acl_principal: str = "User:*"
    #: The compacted topic where the guards of a cluster share their holds (``flow.holds``).
    holds_topic: str = "__diskguard_holds"
    #: A guard that stops renewing its record for this long no longer holds anything.
    hold_lease: HoldLease = 60.0

    def __post_init__(self) -> None:
        if (self.overfull_percent is None) != (self.underfull_percent is None):
            raise ValueError("overfull_percent and underfull_percent must be set together")
        if (
            self.overfull_percent is not None
            and self.underfull_percent is not None
            and self.underfull_percent >= self.overfull_percent
        ):
            raise ValueError(
                f"underfull_percent ({self.underfull_percent}) must be below "
                f"overfull_percent ({self.overfull_percent})"
            )
        if (self.overfull_bytes is None) != (self.underfull_bytes is None):
            raise ValueError("overfull_bytes and underfull_bytes must be set together")
        if (
            self.overfull_bytes is not None
            and self.underfull_bytes is not None
            and self.underfull_bytes >= self.overfull_bytes
        ):
            raise ValueError("underfull_bytes must be below overfull_bytes")
        if "exec" in self.actuators and not self.on_change:
            raise ValueError("actuator 'exec' needs flow_control.on_change")
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", self.holds_topic):
            raise ValueError(f"holds_topic: not a valid Kafka topic name: {self.holds_topic!r}")

    @property
    def enabled(self) -> bool:
        return self.overfull_percent is not None or self.overfull_bytes is not None


@dataclass(frozen=True)
class AlertsConfig:
    low_space_percent: Percent | None = None
    low_space_bytes: Size | None = None


@dataclass(frozen=True)
class BallastConfig:
    path: Path | None = None
    size: Size = 1024**3


def _hostname() -> str:
    """gethostname(), read as glibc does (uname's nodename) without importing socket."""
    return os.uname().nodename


@dataclass(frozen=True)
class SnapshotsConfig:
    interval: SnapshotInterval = 60.0
    topic: str | None = None
    spool_max_bytes: Size = 64 * 1024**2
    spool_file_bytes: Size = 4 * 1024**2
    host: str = field(default_factory=_hostname)


@dataclass(frozen=True)
class MetricsConfig:
    listen: HostPort | None = None


@dataclass(frozen=True)
class LoggingConfig:
    format: Literal["json", "console"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"


@dataclass(frozen=True)
class DaemonConfig:
    state_dir: Path = Path("/var/lib/diskguard")


@dataclass(frozen=True)
class Config:
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    ladder: LadderConfig = field(default_factory=LadderConfig)
    flow_control: FlowControlConfig = field(default_factory=FlowControlConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    ballast: BallastConfig = field(default_factory=BallastConfig)
    snapshots: SnapshotsConfig = field(default_factory=SnapshotsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    #: Where this config was read from (messages name it); not a TOML key.
    source: Path = field(default=Path("<memory>"), metadata={"toml": False})


def _lines(path: Path, problems: list[Problem]) -> list[str]:
    return [f"{path}: {dotted(loc)}: {message}" for loc, message in problems]


def parse_config(data: dict[str, Any], source: Path, writes: bool = True) -> Config:
    """Validate an already-parsed TOML table; raises ConfigError listing every problem.

    ``writes``: the caller will write to ``daemon.state_dir`` (the daemon, ``enforce``,
    ``check-config`` checking for them), so it must be writable by this user. Read-only
    commands (``plan``, ``status``, ``audit``) only need it not to be something else.
    """
    problems: list[Problem] = []
    config = build(Config, data, (), problems)
    if config is None:
        raise ConfigError(_lines(source, problems))
    broker_table = data.get("broker")
    given = set(broker_table) if isinstance(broker_table, dict) else set()
    return _resolve(dataclasses.replace(config, source=source), given, writes)


def _resolve(config: Config, broker_keys: set[str], writes: bool = True) -> Config:
    """Cross-file checks: server.properties, log dirs existing, state dir usable, the hook
    runnable, a broker address for what needs one. All of them are checks of what the config
    asks for, so every command refuses such a config, not only the one that would trip.
    ``broker_keys``: the keys the file's ``[broker]`` sets (server.properties fills the rest)."""
    source = config.source
    problems: list[str] = []
    broker = config.broker
    log_dirs = list(broker.log_dirs)
    updates: dict[str, Any] = {}
    if broker.server_properties is not None:
        try:
            props = read_server_properties(broker.server_properties)
        except OSError as exc:
            problems.append(
                f"{source}: broker.server_properties: cannot read {broker.server_properties}: "
                f"{exc.strerror or exc}"
            )
        else:
            if not log_dirs:
                log_dirs = list(props.log_dirs)
            if props.segment_bytes is not None and "segment_bytes" not in broker_keys:
                updates["segment_bytes"] = props.segment_bytes
            if props.segment_index_bytes is not None and "segment_index_bytes" not in broker_keys:
                updates["segment_index_bytes"] = props.segment_index_bytes
    if not log_dirs and not problems:
        problems.append(
            f"{source}: broker.log_dirs: no log dirs configured "
            "(set broker.log_dirs or broker.server_properties with log.dirs)"
        )
    resolved_dirs: list[Path] = []
    first_index: dict[Path, int] = {}
    for index, log_dir in enumerate(log_dirs):
        key = f"broker.log_dirs[{index}]"
        if not log_dir.is_absolute():
            problems.append(f"{source}: {key}: must be an absolute path, got {str(log_dir)!r}")
        elif not log_dir.is_dir():
            problems.append(
                f"{source}: {key}: log dir {log_dir} does not exist or is not a directory"
            )
        elif (real := Path(os.path.realpath(log_dir))) in first_index:
            # Refused, not merged with a warning: Kafka refuses duplicate log.dirs too, and a
            # duplicate is most often a typo for another disk, which would go unguarded.
            first = first_index[real]
            problems.append(
                f"{source}: {key}: {log_dir} is the same directory as broker.log_dirs[{first}] "
                f"({log_dirs[first]}); Kafka refuses duplicate log.dirs too: list each log dir "
                "once (was another disk meant?)"
            )
        else:
            first_index[real] = index
            resolved_dirs.append(real)
    ballast = config.ballast.path
    if ballast is not None and not ballast.is_absolute():
        problems.append(f"{source}: ballast.path: must be an absolute path, got {str(ballast)!r}")
    for key, own in (("daemon.state_dir", config.daemon.state_dir), ("ballast.path", ballast)):
        inside = inside_log_dir(own, resolved_dirs) if own is not None else None
        if inside is not None:
            problems.append(f"{source}: {key}: {inside}")
    flow = config.flow_control
    if not broker.bootstrap_servers:
        for kind in ("quota", "acl"):
            if kind in flow.actuators:
                problems.append(
                    f"{source}: flow_control.actuators: actuator '{kind}' needs "
                    "broker.bootstrap_servers"
                )
        if config.snapshots.topic:
            problems.append(
                f"{source}: snapshots.topic: needs broker.bootstrap_servers "
                "(snapshots are sent through it)"
            )
    if flow.on_change:
        problem = program_problem(flow.on_change[0])
        if problem is not None:
            problems.append(f"{source}: flow_control.on_change[0]: {problem}")
    problem = state_dir_problem(config.daemon.state_dir, writes)
    if problem is not None:
        problems.append(f"{source}: daemon.state_dir: {problem}")
    if problems:
        raise ConfigError(problems)
    updates["log_dirs"] = resolved_dirs
    top: dict[str, Any] = {"broker": dataclasses.replace(broker, **updates)}
    if flow.on_change and "exec" not in flow.actuators:
        # A configured hook is meant to run: without this, ``on_change`` alone was ignored
        # while the daemon still logged that producers were being held back.
        top["flow_control"] = dataclasses.replace(flow, actuators=[*flow.actuators, "exec"])
    return dataclasses.replace(config, **top)


def load_config(path: Path, writes: bool = True) -> Config:
    """Read and validate ``path``; every failure is a ConfigError of one-line messages.
    ``writes``: see ``parse_config``."""
    # Never a plain read: ``-c`` on a FIFO blocked in open() until a writer came, and
    # ``-c /dev/zero`` read until MemoryError. Regular files only, bounded.
    try:
        raw = safeopen.read_bytes(path, limit=MAX_CONFIG_BYTES, follow=True)
    except FileNotFoundError:
        raise ConfigError([f"{path}: config file not found"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config: {exc.strerror or exc}"]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not UTF-8 text (byte {exc.start})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: TOML syntax error: {exc}"]) from None
    return parse_config(data, path, writes)
