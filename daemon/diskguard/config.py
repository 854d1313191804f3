"""The one TOML file: loaded, validated and typed before any command does anything.

Every problem is reported as one line ``FILE: key.path: what is wrong`` so that an operator
fixing a config at 3 a.m. sees all problems at once, not one per restart. Unknown keys are
errors: a misspelt ``disk_usage_persent`` silently falling back to "off" is the worst
possible failure for a guard.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from diskguard import safeopen
from diskguard.units import parse_duration, parse_size

DEFAULT_CONFIG_PATH = Path("/etc/diskguard/diskguard.toml")

#: Topics Kafka and its ecosystem keep for themselves; never candidates by default.
DEFAULT_PROTECTED_TOPICS: tuple[str, ...] = (
    r"^__consumer_offsets$",
    r"^__transaction_state$",
    r"^__cluster_metadata$",
    r"^__share_group_state$",
    r"^_schemas$",
    r"^__.*",
)

Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
Percent = Annotated[float, Field(gt=0, le=100)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BrokerConfig(_Section):
    log_dirs: list[Path] = Field(default_factory=list)
    server_properties: Path | None = None
    bootstrap_servers: str | None = None
    client: dict[str, str | int | float | bool] = Field(default_factory=dict)
    #: Used for the IBM reserved-size check and offline headroom when server.properties
    #: does not say; Kafka's own defaults.
    segment_bytes: Size = 1024**3
    segment_index_bytes: Size = 10 * 1024**2


class RetentionConfig(_Section):
    disk_usage_percent: Percent = 100.0
    target_percent: Percent | None = None
    max_bytes: Size | None = None
    mode: Literal["auto", "broker", "offline", "dry-run"] = "auto"
    protect_topics: list[str] = Field(default_factory=lambda: list(DEFAULT_PROTECTED_TOPICS))
    check_interval: Duration = 5.0
    #: How often the daemon re-reads each filesystem's usage (one statvfs, microseconds) between
    #: inotify hints: what keeps the reaction time under a second even when events are lost.
    usage_poll_interval: Duration = 0.25
    #: Offline rescue only: extra free space left for the broker's own log recovery
    #: (producer snapshots, checkpoints, index rebuilds write before it can serve).
    offline_headroom: Size = 256 * 1024**2
    #: Prefer, among equally old segments, those every consumer group has read.
    consumer_aware: bool = True

    @field_validator("protect_topics")
    @classmethod
    def _regexes_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
        return patterns

    @model_validator(mode="after")
    def _target_below_ceiling(self) -> RetentionConfig:
        if self.target_percent is not None and self.target_percent > self.disk_usage_percent:
            raise ValueError(
                f"target_percent ({self.target_percent}) must not exceed "
                f"disk_usage_percent ({self.disk_usage_percent})"
            )
        return self

    @property
    def effective_target_percent(self) -> float:
        return self.disk_usage_percent if self.target_percent is None else self.target_percent


class QuotaConfig(_Section):
    """AlterClientQuotas entity and rate applied while overfull."""

    producer_byte_rate: Size = 1024
    #: Entities as Kafka names them, e.g. ``{"user" = "alice"}`` or ``{"client-id" = "app"}``;
    #: empty = the default entity for users and client ids.
    entities: list[dict[str, str | None]] = Field(default_factory=list)


class FlowControlConfig(_Section):
    overfull_percent: Percent | None = None
    underfull_percent: Percent | None = None
    overfull_bytes: Size | None = None
    underfull_bytes: Size | None = None
    #: Hard floor on free space, like Redpanda's storage_min_free_bytes. None = min(5 GiB, 5%).
    min_free_bytes: Size | None = None
    on_change: list[str] = Field(default_factory=list)
    on_change_timeout: Duration = 30.0
    actuators: list[Literal["exec", "quota", "acl"]] = Field(default_factory=list)
    quota: QuotaConfig = Field(default_factory=QuotaConfig)
    #: ACL principal denied WRITE while overfull.
    acl_principal: str = "User:*"

    @model_validator(mode="after")
    def _hysteresis(self) -> FlowControlConfig:
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
        return self

    @property
    def enabled(self) -> bool:
        return self.overfull_percent is not None or self.overfull_bytes is not None


class AlertsConfig(_Section):
    low_space_percent: Percent | None = None
    low_space_bytes: Size | None = None


class BallastConfig(_Section):
    path: Path | None = None
    size: Size = 1024**3


class SnapshotsConfig(_Section):
    interval: Duration = 60.0
    topic: str | None = None
    spool_max_bytes: Size = 64 * 1024**2
    spool_file_bytes: Size = 4 * 1024**2
    host: str = Field(default_factory=socket.gethostname)


class MetricsConfig(_Section):
    listen: str | None = None

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return None
        _host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f'expected HOST:PORT such as "127.0.0.1:9309", got {value!r}')
        return value


class LoggingConfig(_Section):
    format: Literal["json", "console"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"


class DaemonConfig(_Section):
    state_dir: Path = Path("/var/lib/diskguard")


class Config(_Section):
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    flow_control: FlowControlConfig = Field(default_factory=FlowControlConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    ballast: BallastConfig = Field(default_factory=BallastConfig)
    snapshots: SnapshotsConfig = Field(default_factory=SnapshotsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    daemon: DaemonConfig = Field(default_factory=DaemonConfig)
    #: Where this config was read from; not a TOML key.
    source: Path = Field(default=Path("<memory>"), exclude=True)


class ConfigError(Exception):
    """All problems found in one config file, each already a one-line message."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ServerProperties:
    """The few broker settings diskguard reads from ``server.properties``."""

    log_dirs: tuple[Path, ...]
    segment_bytes: int | None
    segment_index_bytes: int | None


def read_properties(path: Path) -> dict[str, str]:
    """Java ``.properties`` lines: ``key=value``, ``key: value`` or ``key value``, ``#``/``!``
    comments and ``\\`` continuations (``server.properties``, ``meta.properties``).

    Read through ``safeopen``: ``meta.properties`` lives in a log dir, where a FIFO would block
    a plain ``open`` forever; anything but a regular file raises an OSError naming it."""
    props: dict[str, str] = {}
    pending = ""
    for raw in safeopen.read_text(path, errors="replace").splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line.startswith(("#", "!")):
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        match = re.match(r"^([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if match:
            props[match.group(1)] = match.group(2).strip()
        else:
            props[line] = ""
    return props


def read_server_properties(path: Path) -> ServerProperties:
    """Only ``log.dirs``/``log.dir`` and segment sizes matter here."""
    props = read_properties(path)
    dirs_value = props.get("log.dirs") or props.get("log.dir") or ""
    log_dirs = tuple(Path(d.strip()) for d in dirs_value.split(",") if d.strip())

    def _int(key: str) -> int | None:
        raw = props.get(key)
        return int(raw) if raw is not None and raw.strip().isdigit() else None

    # The broker-level key for a topic's segment.index.bytes is log.index.size.max.bytes.
    index_bytes = _int("log.index.size.max.bytes")
    if index_bytes is None:
        index_bytes = _int("segment.index.bytes")
    return ServerProperties(log_dirs, _int("log.segment.bytes"), index_bytes)


def _dotted(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        elif re.fullmatch(r"[A-Za-z0-9_-]+", item):
            parts.append(item)
        else:
            # Quoted as TOML would (a key with a newline must not break the one-line rule).
            parts.append(json.dumps(item))
    return ".".join(parts) or "(top level)"


def _pydantic_problems(path: Path, exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        msg = msg.removeprefix("Value error, ")
        problems.append(f"{path}: {_dotted(loc)}: {msg}")
    return problems


def parse_config(data: dict[str, Any], source: Path) -> Config:
    """Validate an already-parsed TOML table; raises ConfigError listing every problem."""
    try:
        config = Config.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise ConfigError(_pydantic_problems(source, exc)) from None
    return _resolve(config)


def _resolve(config: Config) -> Config:
    """Cross-file checks: server.properties, log dirs existing, state dir usable."""
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
            if props.segment_bytes is not None and "segment_bytes" not in broker.model_fields_set:
                updates["segment_bytes"] = props.segment_bytes
            if (
                props.segment_index_bytes is not None
                and "segment_index_bytes" not in broker.model_fields_set
            ):
                updates["segment_index_bytes"] = props.segment_index_bytes
    if not log_dirs and not problems:
        problems.append(
            f"{source}: broker.log_dirs: no log dirs configured "
            "(set broker.log_dirs or broker.server_properties with log.dirs)"
        )
    resolved_dirs: list[Path] = []
    for index, log_dir in enumerate(log_dirs):
        key = f"broker.log_dirs[{index}]"
        if not log_dir.is_absolute():
            problems.append(f"{source}: {key}: must be an absolute path, got {str(log_dir)!r}")
        elif not log_dir.is_dir():
            problems.append(
                f"{source}: {key}: log dir {log_dir} does not exist or is not a directory"
            )
        else:
            resolved_dirs.append(Path(os.path.realpath(log_dir)))
    if len(set(resolved_dirs)) != len(resolved_dirs):
        problems.append(f"{source}: broker.log_dirs: the same log dir is listed twice")
    ballast = config.ballast.path
    if ballast is not None and not ballast.is_absolute():
        problems.append(f"{source}: ballast.path: must be an absolute path, got {str(ballast)!r}")
    if problems:
        raise ConfigError(problems)
    updates["log_dirs"] = resolved_dirs
    return config.model_copy(update={"broker": broker.model_copy(update=updates)})


def load_config(path: Path) -> Config:
    """Read and validate ``path``; every failure is a ConfigError of one-line messages."""
    try:
        raw = path.read_bytes()
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
    return parse_config(data, path)
