"""Config validation: one clear line per problem, exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import pytest

from diskguard.config import ConfigError, load_config, parse_config
from diskguard.units import parse_duration, parse_size

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diskguard", *args], capture_output=True, text=True, timeout=60
    )


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
    from pydantic import BaseModel

    from diskguard.config import Config

    keys: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            if name == "source":
                continue
            ann = info.annotation
            args = [
                typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a
                for a in (typing.get_args(ann) or (ann,))
                if a is not type(None)
            ]
            if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel):
                walk(args[0], f"{prefix}{name}.")
            elif args and all(a in (int, float) for a in args):
                keys.append(f"{prefix}{name}")

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
    config = parse_config(_with(tmp_path, key, floor), tmp_path / "c.toml")
    section, _, name = key.rpartition(".")
    table = config
    for part in section.split("."):
        table = getattr(table, part)
    assert getattr(table, name) == parse_duration(floor)


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
    from diskguard.actuators import Actuators
    from diskguard.flowstate import FlowLimits, FlowState, step
    from diskguard.model import FilesystemUsage

    record = tmp_path / "events"
    hook = hook_script(tmp_path, body=f'echo "$DISKGUARD_EVENT" >> {record}\n')
    path = write(
        tmp_path,
        f'[broker]\nlog_dirs = ["{tmp_path}"]\n[flow_control]\noverfull_percent = 90\n'
        f'underfull_percent = 80\non_change = ["{hook}"]\n'
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n',
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
