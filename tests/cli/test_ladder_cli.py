"""What status and check-config say of the ladder and the KRaft metadata log, from disk."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import run_cli
from support.configs import write_config


def _log_dir(tmp_path: Path, with_metadata: bool) -> Path:
    log_dir = tmp_path / "kafka-logs"
    (log_dir / "orders-0").mkdir(parents=True)
    if with_metadata:
        (log_dir / "__cluster_metadata-0").mkdir()
    return log_dir


def test_status_and_check_config_say_where_the_metadata_log_lives(tmp_path: Path) -> None:
    log_dir = _log_dir(tmp_path, with_metadata=True)
    cfg = write_config(tmp_path, log_dir)
    proc = run_cli("check-config", "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert f"KRaft metadata log: {log_dir}/__cluster_metadata-0 (found in log dir)" in proc.stdout
    assert "metadata_log_at_risk" in proc.stdout
    status = json.loads(run_cli("status", "--json", "-c", str(cfg)).stdout)
    assert status["kraft_metadata"]["path"] == f"{log_dir}/__cluster_metadata-0"
    assert status["kraft_metadata"]["shares_data_disk"] is True
    human = run_cli("status", "-c", str(cfg)).stdout
    assert "KRaft metadata log:" in human


def test_metadata_log_dir_from_server_properties_outside_the_guarded_dirs(tmp_path: Path) -> None:
    log_dir = _log_dir(tmp_path, with_metadata=False)
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={log_dir}\nmetadata.log.dir={tmp_path / 'meta'}\n")
    cfg = write_config(tmp_path, log_dir, broker={"server_properties": props})
    out = run_cli("check-config", "-c", str(cfg)).stdout
    assert "server.properties metadata.log.dir" in out and "not on a guarded disk" in out


def test_no_metadata_log_no_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, _log_dir(tmp_path, with_metadata=False))
    proc = run_cli("check-config", "-c", str(cfg))
    assert proc.stdout.count("\n") == 1, proc.stdout
    assert json.loads(run_cli("status", "--json", "-c", str(cfg)).stdout)["kraft_metadata"] is None


def test_status_shows_what_the_ladder_changed(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, _log_dir(tmp_path, with_metadata=False))
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "ladder.json").write_text(
        json.dumps(
            {
                "version": 1,
                "lowered": {
                    "orders": {
                        "key": "local.retention.ms",
                        "value": "1000",
                        "previous": None,
                        "mounts": ["/data"],
                        "since_ms": 1,
                    }
                },
                "moves": {},
                "cordoned": ["/data/kafka"],
                "move_rate": 1e6,
            }
        )
    )
    status = json.loads(run_cli("status", "--json", "-c", str(cfg)).stdout)
    assert status["ladder"]["lowered"]["orders"]["value"] == "1000"
    assert status["ladder"]["cordoned"] == ["/data/kafka"]
    human = run_cli("status", "-c", str(cfg)).stdout
    assert "orders local.retention.ms lowered to 1000 ms (was broker default)" in human
    assert "cordoned by diskguard: /data/kafka" in human
