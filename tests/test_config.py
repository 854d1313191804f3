"""Config validation: one clear line per problem, exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
import tomllib
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
