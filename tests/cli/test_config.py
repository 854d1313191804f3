"""Config validation: one clear line per problem, exit 2, never a traceback."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tomllib
import typing
from pathlib import Path

import pytest

from diskguard.config import load_config, parse_config
from diskguard.errors import ConfigError
from diskguard.units import parse_duration, parse_size
from support.cli import run_cli
from support.configs import write_config

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "diskguard.toml"
    path.write_text(text)
    return path


def test_example_config_is_complete_and_valid(tmp_path: Path) -> None:
    data = tomllib.loads((REPO / "config" / "diskguard.toml").read_text())
    data["broker"]["log_dirs"] = [str(tmp_path)]
    config = parse_config(data, tmp_path / "x.toml")
    assert config.retention.disk_usage_percent == 100.0
    assert config.retention.check_interval == 5.0


def test_valid_config_exit_0(tmp_path: Path) -> None:
    path = write(
        tmp_path, f'[broker]\nlog_dirs = ["{tmp_path}"]\n[retention]\ndisk_usage_percent = 85\n'
    )
    proc = run_cli("check-config", "-c", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


def test_every_problem_is_one_line_with_file_and_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
[broker]
log_dirs = ["{tmp_path}", "/does/not/exist"]
[retention]
disk_usage_percent = 150
check_interval = "5 fortnights"
disk_usage_persent = 80
[flow_control]
overfull_percent = 80
underfull_percent = 90
""",
    )
    proc = run_cli("check-config", "-c", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert all(line.startswith(f"{path}: ") for line in lines), lines
    text = proc.stderr
    assert "retention.disk_usage_percent" in text
    assert "retention.check_interval" in text
    assert "retention.disk_usage_persent: unknown key" in text
    assert "flow_control" in text and "underfull_percent" in text


def test_topic_regex_lists_are_validated_and_protect_topics_defaults_to_empty(
    tmp_path: Path,
) -> None:
    base = {"broker": {"log_dirs": [str(tmp_path)]}}
    config = parse_config(base, tmp_path / "c.toml")
    # Internal topics are protected by topicpolicy, not by a default list a user replaces.
    assert config.retention.protect_topics == []
    assert config.retention.assume_delete_policy == []
    with pytest.raises(ConfigError) as exc:
        parse_config(
            {**base, "retention": {"assume_delete_policy": ["^ok$", "(unclosed"]}},
            tmp_path / "c.toml",
        )
    assert len(exc.value.problems) == 1
    problem = exc.value.problems[0]
    assert problem.startswith(f"{tmp_path / 'c.toml'}: retention.assume_delete_policy: ")
    assert "(unclosed" in problem


def test_missing_log_dir_named(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nlog_dirs = ["/does/not/exist"]\n')
    proc = run_cli("check-config", "-c", str(path))
    assert proc.returncode == 2
    assert "broker.log_dirs[0]" in proc.stderr and "/does/not/exist" in proc.stderr


def test_syntax_error_has_line_number(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nlog_dirs = ["/tmp"\n[retention]\n')
    proc = run_cli("check-config", "-c", str(path))
    assert proc.returncode == 2
    assert "line" in proc.stderr and str(path) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_file_exit_2(tmp_path: Path) -> None:
    proc = run_cli("check-config", "-c", str(tmp_path / "nope.toml"))
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_server_properties_supplies_log_dirs(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    props = tmp_path / "server.properties"
    props.write_text(f"# comment\nlog.dirs={data_dir}\nlog.segment.bytes=536870912\n")
    config = parse_config({"broker": {"server_properties": str(props)}}, tmp_path / "c.toml")
    assert [str(d) for d in config.broker.log_dirs] == [str(data_dir)]
    assert config.broker.segment_bytes == 512 * 1024**2


def test_target_must_not_exceed_ceiling(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "broker": {"log_dirs": [str(tmp_path)]},
                "retention": {"disk_usage_percent": 80, "target_percent": 90},
            },
            tmp_path / "c.toml",
        )
    assert "target_percent" in err.value.problems[0]


def test_units() -> None:
    assert parse_size("50GiB") == 50 * 1024**3
    assert parse_size("1GB") == 10**9
    assert parse_size(123) == 123
    assert parse_duration("250ms") == 0.25
    assert parse_duration("1m") == 60
    with pytest.raises(ValueError):
        parse_size("12 parsecs")


def test_load_config_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xff\xfe[broker]")
    with pytest.raises(ConfigError):
        load_config(path)


# -- numbers are numbers, intervals have floors (issue 11 item 10) -----------------------------


def _numeric_keys() -> list[str]:
    """Every numeric config key (percent, size, duration), found by walking the model so a key
    added later is covered without touching this test."""
    from diskguard.config import Config

    keys: list[str] = []

    def walk(section: type, prefix: str) -> None:
        for info in dataclasses.fields(section):
            if not info.metadata.get("toml", True):
                continue
            ann = info.type
            if typing.get_origin(ann) is typing.Annotated:
                ann = typing.get_args(ann)[0]
            args = [
                typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a
                for a in (typing.get_args(ann) or (ann,))
                if a is not type(None)
            ]
            if len(args) == 1 and dataclasses.is_dataclass(args[0]):
                walk(args[0], f"{prefix}{info.name}.")  # type: ignore[arg-type]
            elif args and all(a in (int, float) for a in args):
                keys.append(f"{prefix}{info.name}")

    walk(Config, "")
    return keys


def _with(tmp_path: Path, dotted: str, value: object) -> dict[str, object]:
    data: dict[str, object] = {"broker": {"log_dirs": [str(tmp_path)]}}
    *sections, key = dotted.split(".")
    table = data
    for section in sections:
        table = table.setdefault(section, {})  # type: ignore[assignment]
    table[key] = value
    return data


def test_the_numeric_key_walk_sees_every_kind() -> None:
    keys = _numeric_keys()
    for expected in (
        "retention.disk_usage_percent",
        "retention.check_interval",
        "retention.max_bytes",
        "flow_control.quota.producer_byte_rate",
        "snapshots.interval",
        "alerts.low_space_percent",
    ):
        assert expected in keys


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("key", _numeric_keys())
def test_a_boolean_is_not_a_number_for_any_key(tmp_path: Path, key: str, value: bool) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_with(tmp_path, key, value), tmp_path / "c.toml")
    problems = err.value.problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{tmp_path / 'c.toml'}: {key}: "), problems
    assert "boolean" in problems[0], problems


def test_disk_usage_percent_true_is_rejected_on_the_cli(tmp_path: Path) -> None:
    path = write(
        tmp_path, f'[broker]\nlog_dirs = ["{tmp_path}"]\n[retention]\ndisk_usage_percent = true\n'
    )
    proc = run_cli("check-config", "-c", str(path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"{path}: retention.disk_usage_percent: expected a number, got a boolean"
    ]


def test_consumer_aware_is_a_real_boolean(tmp_path: Path) -> None:
    for value in (1, 0, "yes"):
        with pytest.raises(ConfigError) as err:
            parse_config(_with(tmp_path, "retention.consumer_aware", value), tmp_path / "c.toml")
        assert "retention.consumer_aware" in err.value.problems[0]
    config = parse_config(_with(tmp_path, "retention.consumer_aware", False), tmp_path / "c.toml")
    assert config.retention.consumer_aware is False


#: key -> (smallest accepted value, a value just below it)
FLOORS = {
    "retention.check_interval": ("100ms", "99ms"),
    "retention.usage_poll_interval": ("10ms", "9ms"),
    "snapshots.interval": ("100ms", "99ms"),
    "flow_control.on_change_timeout": ("100ms", "99ms"),
}


@pytest.mark.parametrize("key", sorted(FLOORS))
def test_intervals_have_floors(tmp_path: Path, key: str) -> None:
    floor, below = FLOORS[key]
    for bad in (0, "0s", below):
        with pytest.raises(ConfigError) as err:
            parse_config(_with(tmp_path, key, bad), tmp_path / "c.toml")
        (problem,) = err.value.problems
        assert problem.startswith(f"{tmp_path / 'c.toml'}: {key}: must be at least {floor}")
        assert problem.endswith(f", got {bad!r}"), problem  # as written, not in seconds
    config = parse_config(_with(tmp_path, key, floor), tmp_path / "c.toml")
    section, _, name = key.rpartition(".")
    table = config
    for part in section.split("."):
        table = getattr(table, part)
    assert getattr(table, name) == parse_duration(floor)


def test_the_quota_rate_is_a_rate_kafka_takes(tmp_path: Path) -> None:
    """Kafka refuses a producer_byte_rate of 0 (AlterClientQuotas, seen on 4.4: "must be
    greater than 0"); a size below one byte rounds to 0. Said at start, naming the key,
    rather than an actuator_failed at every overfull with producers not throttled."""
    key = "flow_control.quota.producer_byte_rate"
    for bad in (0, "0.5", "0KiB"):
        with pytest.raises(ConfigError) as err:
            parse_config(_with(tmp_path, key, bad), tmp_path / "c.toml")
        (problem,) = err.value.problems
        assert problem.startswith(f"{tmp_path / 'c.toml'}: {key}: must be a rate"), problem
        # The value as written: "0.5" read as whole bytes is 0, which the operator never wrote.
        assert problem.endswith(f", got {bad!r}"), problem
    config = parse_config(_with(tmp_path, key, 1), tmp_path / "c.toml")
    assert config.flow_control.quota.producer_byte_rate == 1


def test_check_config_names_the_rate_as_written(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f'[broker]\nlog_dirs = ["{tmp_path}"]\nbootstrap_servers = "127.0.0.1:9"\n'
        '[flow_control]\nactuators = ["quota"]\n[flow_control.quota]\nproducer_byte_rate = "0.5"\n',
    )
    proc = run_cli("check-config", "-c", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"{path}: flow_control.quota.producer_byte_rate: must be a rate of at least 1 byte "
        "per second, got '0.5'"
    ]


def test_zero_intervals_on_the_cli_exit_2_naming_each_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f'[broker]\nlog_dirs = ["{tmp_path}"]\n[retention]\ncheck_interval = 0\n'
        "usage_poll_interval = 0\n[snapshots]\ninterval = 0\n",
    )
    proc = run_cli("check-config", "-c", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3, lines
    for key in ("retention.check_interval", "retention.usage_poll_interval", "snapshots.interval"):
        assert any(line.startswith(f"{path}: {key}: must be at least ") for line in lines), lines


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("retention.check_interval", 1e300),
        ("retention.usage_poll_interval", "99999999999d"),
        ("snapshots.interval", 10**400),  # an int too large for a float
        ("flow_control.on_change_timeout", "9" * 400),
        ("retention.max_bytes", 2**63),
        ("ballast.size", "9" * 400 + "TiB"),
        ("retention.offline_headroom", 1e300),
        ("broker.segment_bytes", 10**400),
    ],
    ids=lambda v: repr(v)[:24],
)
def test_huge_values_are_one_clear_line(tmp_path: Path, key: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_with(tmp_path, key, value), tmp_path / "c.toml")
    (problem,) = err.value.problems
    assert problem.startswith(f"{tmp_path / 'c.toml'}: {key}: "), problem
    assert "at most" in problem, problem


@pytest.mark.parametrize(
    "value",
    [True, False, -1, -0.5, "-1", float("nan"), float("inf"), float("-inf"), 10**400, "9" * 400],
    ids=repr,
)
def test_units_reject_what_is_not_a_size_or_duration(value: object) -> None:
    with pytest.raises(ValueError):
        parse_size(value)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        parse_duration(value)  # type: ignore[arg-type]


def test_units_upper_bounds() -> None:
    assert parse_size(2**63 - 1) == 2**63 - 1
    with pytest.raises(ValueError, match="at most"):
        parse_size(2**63)
    with pytest.raises(ValueError, match="at most"):
        parse_size("9000000TiB")
    with pytest.raises(ValueError, match="at most"):
        parse_duration("9" * 400)


# -- issue 13: configs that cannot work are caught by every command ---------------------------


def hook_script(tmp_path: Path, name: str = "hook.sh", body: str = "") -> Path:
    hook = tmp_path / name
    hook.write_text("#!/bin/sh\n" + body)
    hook.chmod(0o755)
    return hook


def test_on_change_alone_enables_the_exec_actuator_and_the_hook_runs(tmp_path: Path) -> None:
    """``on_change`` without ``"exec"`` in ``actuators`` used to be ignored silently: the
    daemon said producers were blocked and ran nothing. A configured hook now runs."""
    from diskguard.flow.reconcile import Actuators
    from diskguard.flow.state import FlowLimits, FlowState, step
    from diskguard.kafkalog.model import FilesystemUsage

    record = tmp_path / "events"
    hook = hook_script(tmp_path, body=f'echo "$DISKGUARD_EVENT" >> {record}\n')
    path = write_config(
        tmp_path,
        tmp_path,
        flow_control={"overfull_percent": 90, "underfull_percent": 80, "on_change": [hook]},
        assume_delete_policy=None,
    )
    proc = run_cli("check-config", "-c", str(path))
    assert proc.returncode == 0, proc.stderr
    config = load_config(path)
    assert config.flow_control.actuators == ["exec"]
    total = 100 * 1024**3
    usage = FilesystemUsage("/data", "/dev/x", total, total * 95 // 100, total * 5 // 100)
    _, transitions = step(FlowState(), usage, FlowLimits(90.0, 80.0, min_free_bytes=0))
    acts = Actuators(config, background=False)
    try:
        for transition in transitions:
            acts.apply(transition)
        assert acts.wait_idle(20)
    finally:
        acts.close()
    assert record.read_text().split() == ["overfull"]
    # Listing it as well stays valid and does not run the hook twice.
    both = parse_config(
        {
            "broker": {"log_dirs": [str(tmp_path)]},
            "flow_control": {"on_change": [str(hook)], "actuators": ["exec"]},
        },
        tmp_path / "c.toml",
    )
    assert both.flow_control.actuators == ["exec"]


def config_text(tmp_path: Path, extra: str = "", state_dir: Path | str | None = None) -> str:
    """A valid config whose log dir is ``tmp_path/"kafka-logs"`` (made here) and state dir
    ``tmp_path/"state"``, beside it: never inside a log dir."""
    logs = tmp_path / "kafka-logs"
    logs.mkdir(exist_ok=True)
    state = tmp_path / "state" if state_dir is None else state_dir
    return f'[broker]\nlog_dirs = ["{logs}"]\n{extra}\n[daemon]\nstate_dir = "{state}"\n'


def problem_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc.stderr.strip().splitlines()


def test_broker_actuators_and_snapshot_topic_need_bootstrap_servers(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        config_text(
            tmp_path,
            "[flow_control]\noverfull_percent = 90\nunderfull_percent = 80\n"
            'actuators = ["quota", "acl"]\n[snapshots]\ntopic = "diskguard.snapshots"\n',
        ),
    )
    assert problem_lines(run_cli("check-config", "-c", str(path))) == [
        f"{path}: flow_control.actuators: actuator 'quota' needs broker.bootstrap_servers",
        f"{path}: flow_control.actuators: actuator 'acl' needs broker.bootstrap_servers",
        f"{path}: snapshots.topic: needs broker.bootstrap_servers (snapshots are sent through it)",
    ]
    fixed = write(
        tmp_path,
        config_text(
            tmp_path,
            "[flow_control]\noverfull_percent = 90\nunderfull_percent = 80\n"
            'actuators = ["quota", "acl"]\n[snapshots]\ntopic = "diskguard.snapshots"\n',
        ).replace("[broker]\n", '[broker]\nbootstrap_servers = "127.0.0.1:9"\n'),
    )
    proc = run_cli("check-config", "-c", str(fixed))
    assert proc.returncode == 0, proc.stderr


def test_on_change_program_is_resolved_like_execvp(tmp_path: Path) -> None:
    """The hook used to fail only at the first overfull, when the disk is already full."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    hook_script(bin_dir, "on-path-hook")
    hook_script(tmp_path, "good.sh")
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    (bin_dir / "plain-on-path").write_text("#!/bin/sh\n")
    cases = {
        str(tmp_path / "good.sh"): None,
        "on-path-hook": None,  # found in PATH
        "sh": None,
        str(tmp_path / "missing.sh"): f"{tmp_path / 'missing.sh'} does not exist",
        str(plain): f"{plain} is not executable",
        str(bin_dir): f"{bin_dir} is a directory, not a program",
        "no-such-hook-anywhere": "program 'no-such-hook-anywhere' not found in PATH",
        "plain-on-path": f"program 'plain-on-path' not usable in PATH ({bin_dir}:/usr/bin:/bin): "
        f"{bin_dir / 'plain-on-path'} is not executable",
        "": "the program name is empty",
    }
    env_path = f"{bin_dir}:/usr/bin:/bin"
    for program, wrong in cases.items():
        path = write(
            tmp_path,
            config_text(tmp_path, f'[flow_control]\non_change = [{json.dumps(program)}, "x"]\n'),
        )
        proc = run_cli("check-config", "-c", str(path), env={"PATH": env_path})
        if wrong is None:
            assert proc.returncode == 0, (program, proc.stderr)
            continue
        (line,) = problem_lines(proc)
        assert line.startswith(f"{path}: flow_control.on_change[0]: {wrong}"), line
    # A relative path with a slash is relative to the working directory, as for execvp.
    path = write(tmp_path, config_text(tmp_path, '[flow_control]\non_change = ["./good.sh"]\n'))
    assert run_cli("check-config", "-c", str(path), cwd=tmp_path).returncode == 0
    (line,) = problem_lines(run_cli("check-config", "-c", str(path), cwd=bin_dir))
    assert line == f"{path}: flow_control.on_change[0]: ./good.sh does not exist"


def test_state_dir_must_be_a_usable_directory_for_every_command(
    tmp_path: Path, tmpfs: typing.Callable[[int], Path]
) -> None:
    """``run`` used to exit 1 with "File exists" when state_dir was a regular file."""
    regular = tmp_path / "state-file"
    regular.write_text("not a dir\n")
    path = write(tmp_path, config_text(tmp_path, state_dir=regular))
    want = f"{path}: daemon.state_dir: {regular} is a regular file, not a directory"
    for command in (["check-config"], ["status", "--json"], ["enforce", "--once"], ["audit"]):
        assert problem_lines(run_cli(*command, "-c", str(path))) == [want], command
    below = regular / "state"
    path = write(tmp_path, config_text(tmp_path, state_dir=below))
    assert problem_lines(run_cli("check-config", "-c", str(path))) == [
        f"{path}: daemon.state_dir: cannot create {below}: {regular} is not a directory"
    ]
    # A state dir that does not exist yet but can be created is fine, and is not created by
    # checking the config.
    fresh = tmp_path / "new" / "state"
    path = write(tmp_path, config_text(tmp_path, state_dir=fresh))
    assert run_cli("check-config", "-c", str(path)).returncode == 0
    assert not (tmp_path / "new").exists()
    # On a read-only filesystem: neither an existing dir nor a new one can be written.
    mount = tmpfs(1024**2)
    (mount / "state").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    existing = write(tmp_path, config_text(tmp_path, state_dir=mount / "state"))
    (line,) = problem_lines(run_cli("check-config", "-c", str(existing)))
    assert line.startswith(f"{existing}: daemon.state_dir: {mount / 'state'} is not writable"), line
    new = write(tmp_path, config_text(tmp_path, state_dir=mount / "new" / "state"))
    (line,) = problem_lines(run_cli("check-config", "-c", str(new)))
    assert line.startswith(
        f"{new}: daemon.state_dir: cannot create {mount / 'new' / 'state'}: {mount} is not writable"
    ), line


def test_read_only_commands_do_not_need_a_writable_state_dir(
    tmp_path: Path, tmpfs: typing.Callable[[int], Path]
) -> None:
    """An operator may run plan/status/audit as a user who cannot write the daemon's state dir
    (the unit's is the kafka user's): they only read it. enforce and check-config still say no."""
    mount = tmpfs(1024**2)
    (mount / "state").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    path = write(tmp_path, config_text(tmp_path, state_dir=mount / "state"))
    for command in (["plan", "--json"], ["status", "--json"], ["audit"]):
        proc = run_cli(*command, "-c", str(path))
        assert proc.returncode == 0, (command, proc.stderr)
    for command in (["check-config"], ["enforce", "--once"]):
        (line,) = problem_lines(run_cli(*command, "-c", str(path)))
        assert "daemon.state_dir" in line and "is not writable" in line, (command, line)


@pytest.mark.parametrize(
    ("toml", "key", "hint"),
    [
        (
            "[retention]\ndisk_usage_persent = 80\n",
            "retention.disk_usage_persent",
            "disk_usage_percent",
        ),
        ("[retension]\ndisk_usage_percent = 80\n", "retension", "retention"),
        (
            "[flow_control.quota]\nproducer_byte_rat = 1\n",
            "flow_control.quota.producer_byte_rat",
            "producer_byte_rate",
        ),
        ('[daemon]\nstatedir = "/x"\n', "daemon.statedir", "state_dir"),
        ("[retention]\nzzz = 1\n", "retention.zzz", None),
    ],
)
def test_unknown_keys_suggest_the_close_known_key(
    tmp_path: Path, toml: str, key: str, hint: str | None
) -> None:
    path = write(tmp_path, f'[broker]\nlog_dirs = ["{tmp_path}"]\n{toml}')
    (line,) = problem_lines(run_cli("check-config", "-c", str(path)))
    suffix = f" (did you mean {hint}?)" if hint else ""
    assert line == f"{path}: {key}: unknown key{suffix}"


def _cli_bounded(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with 1 GiB of address space and a 20 s timeout: a config reader that hangs or
    reads without end fails this test instead of the machine."""
    import resource
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "diskguard", *args],
        capture_output=True,
        text=True,
        timeout=20,
        preexec_fn=limit,
    )


@pytest.mark.parametrize("command", [["check-config"], ["plan", "--json"], ["run"]])
def test_a_config_that_is_not_a_regular_file_is_one_line_exit_2(
    tmp_path: Path, command: list[str]
) -> None:
    """``-c`` on a FIFO hung in ``open()`` until a writer came; ``-c /dev/zero`` read until
    MemoryError; a directory or a 2 MiB file is no config either. Each is one line naming the
    file, exit 2, at once."""
    import os

    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.toml"
    huge.write_text(config_text(tmp_path) + "#" * (2 * 1024 * 1024) + "\n")
    cases = {
        fifo: "not a regular file (FIFO)",
        Path("/dev/zero"): "not a regular file (character device)",
        tmp_path: "not a regular file (directory)",
        huge: "larger than 1 MiB",
    }
    for path, why in cases.items():
        proc = _cli_bounded(*command, "-c", str(path))
        assert proc.returncode == 2, (path, proc.returncode, proc.stderr[-500:])
        assert "Traceback" not in proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"{path}: ") and why in line, line


def test_a_config_reached_through_a_symlink_is_read(tmp_path: Path) -> None:
    """/etc/diskguard/diskguard.toml is often a link into a config-management tree."""
    real = write(tmp_path, config_text(tmp_path))
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    assert run_cli("check-config", "-c", str(link)).returncode == 0


def test_a_state_dir_or_ballast_inside_a_log_dir_is_refused(tmp_path: Path) -> None:
    """Kafka refuses to start with a directory in a log dir that is not a partition ("Found
    directory .../diskguard ... is not in the form of topic-partition"): a state dir there
    (created by the first ``enforce --once``), or a ballast in a dir of its own there, would
    keep the broker down. Refused by every command, one line each, exit 2; also when the
    path reaches the log dir through a symlink."""
    logs = tmp_path / "kafka-logs"
    logs.mkdir()
    link = tmp_path / "link"
    link.symlink_to(logs)
    cases = [
        ("daemon.state_dir", f'[daemon]\nstate_dir = "{logs / "diskguard"}"\n', logs / "diskguard"),
        ("daemon.state_dir", f'[daemon]\nstate_dir = "{logs}"\n', logs),
        ("daemon.state_dir", f'[daemon]\nstate_dir = "{link / "dg"}"\n', link / "dg"),
        (
            "ballast.path",
            f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
            f'[ballast]\npath = "{logs / "ballast" / "ballast.img"}"\n',
            logs / "ballast" / "ballast.img",
        ),
        (
            "ballast.path",
            f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[ballast]\npath = "{logs / "b"}"\n',
            logs / "b",
        ),
    ]
    for key, tail, where in cases:
        path = write(tmp_path, f'[broker]\nlog_dirs = ["{logs}"]\n{tail}')
        for command in (["check-config"], ["enforce", "--once"], ["run"], ["plan"]):
            (line,) = problem_lines(run_cli(*command, "-c", str(path)))
            assert line.startswith(f"{path}: {key}: {where} is inside log dir {logs}"), line
            assert "topic-partition" in line, line
        assert sorted(p.name for p in logs.iterdir()) == []  # nothing was created there
    # Beside the log dir (a sibling, or the parent of it) is fine.
    ok = write(
        tmp_path,
        f'[broker]\nlog_dirs = ["{logs}"]\n[daemon]\nstate_dir = "{tmp_path / "kafka-logs-dg"}"\n'
        f'[ballast]\npath = "{tmp_path / "ballast.img"}"\n',
    )
    assert run_cli("check-config", "-c", str(ok)).returncode == 0


def test_a_state_dir_that_cannot_be_made_on_a_full_disk_is_refused(
    tmp_path: Path, loop_ext4: typing.Callable[..., Path]
) -> None:
    """check-config said ok, then the first ``enforce --once`` failed to make the state dir
    (ENOSPC). Checking still creates nothing; a full disk is a problem line, exit 2."""
    import errno
    import os

    mount = loop_ext4(16 * 1024 * 1024)
    chunk = b"\x5a" * 65536
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (65536, 4096, 1):
            while True:
                try:
                    os.write(fd, chunk[:size])
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
        os.fsync(fd)
    finally:
        os.close(fd)
    assert os.statvfs(mount).f_bavail == 0
    path = write(tmp_path, config_text(tmp_path, state_dir=mount / "diskguard"))
    for command in (["check-config"], ["enforce", "--once"]):
        (line,) = problem_lines(run_cli(*command, "-c", str(path)))
        assert line.startswith(
            f"{path}: daemon.state_dir: cannot create {mount / 'diskguard'}: no space left on "
            f"{mount}"
        ), line
    assert not (mount / "diskguard").exists()
    # Read-only commands do not create it: they need no room.
    assert run_cli("plan", "-c", str(path)).returncode == 0
    # With room again, the same config is fine.
    (mount / "filler").unlink()
    assert run_cli("check-config", "-c", str(path)).returncode == 0


def test_a_log_dir_listed_twice_is_refused_naming_both_entries(tmp_path: Path) -> None:
    """The README said "scanned once, with a warning"; the config was refused. Refusing is
    right: Kafka itself refuses duplicate ``log.dirs`` ("Duplicate log directory found"),
    and a duplicate is most often a typo for another disk, which a warning would leave
    unguarded. Now both say so, and the line names both entries (also through a symlink)."""
    logs = tmp_path / "kafka-logs"
    logs.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    link = tmp_path / "link"
    link.symlink_to(logs)
    path = write(
        tmp_path,
        f'[broker]\nlog_dirs = ["{logs}", "{other}", "{link}"]\n'
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n',
    )
    (line,) = problem_lines(run_cli("check-config", "-c", str(path)))
    assert line == (
        f"{path}: broker.log_dirs[2]: {link} is the same directory as broker.log_dirs[0] "
        f"({logs}); Kafka refuses duplicate log.dirs too: list each log dir once "
        "(was another disk meant?)"
    ), line
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "scanned once" not in readme
    assert "The same directory listed twice (two paths to it) is refused" in readme
