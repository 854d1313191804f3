"""A one-shot plan's DescribeLogDirs asked by a forked child (``earlylogdirs``): the ladder
gets the answer, or the failure, it would get asking on a thread of its own, and asks again
only where the child gave nothing."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from diskguard.broker.kafkapython import KafkaPythonAdmin
from diskguard.broker.ladderapi import EarlyAnswer, LadderApi, LadderCallFailed
from diskguard.config import Config, load_config
from diskguard.host.forked import Worker
from diskguard.retention.earlylogdirs import ask_in_child
from support.configs import write_config
from support.workerplan import forced_worker

_ANSWER = [
    {
        "broker": 1,
        "log_dirs": [
            {
                "error_code": 0,
                "log_dir": "/data/a",
                "total_bytes": 100,
                "usable_bytes": 40,
                "is_cordoned": True,
                "topics": [
                    {"name": "orders", "partitions": [{"partition_index": 3, "offset_lag": 7}]}
                ],
            },
            {"error_code": 56, "log_dir": "/data/b", "total_bytes": -1, "usable_bytes": -1},
        ],
    }
]


class _Admin:
    """kafka-python's admin client as a child process sees it (it was made before the fork):
    says which process asked."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.askers: list[int] = []

    def describe_log_dirs(
        self, topic_partitions: dict[str, list[int]], brokers: list[int]
    ) -> list[dict[str, Any]]:
        self.askers.append(os.getpid())
        if self.fail:
            raise ConnectionError("refused")
        return _ANSWER


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> _Admin:
    made = _Admin(fail=getattr(request, "param", False))
    monkeypatch.setattr(KafkaPythonAdmin, "admin", lambda self: made)
    return made


def _api() -> LadderApi:
    return LadderApi(None, KafkaPythonAdmin("127.0.0.1:9092", {}), timeout=1.0)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    """A broker at 127.0.0.1:9092 whose log dir says it is node 1 (``meta.properties``)."""
    log_dir = tmp_path / "kafka-logs"
    log_dir.mkdir()
    (log_dir / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=c\n")
    path = write_config(tmp_path, log_dir, broker={"bootstrap_servers": "127.0.0.1:9092"})
    return load_config(path, writes=False)


def _asked(config: Config, worker: Worker) -> EarlyAnswer:
    early = ask_in_child(config, worker)
    assert early is not None and early[0] == 1
    return early[1]


def test_the_child_asks_and_the_ladder_gets_what_a_thread_gets(
    admin: _Admin, config: Config
) -> None:
    here = _api()
    here.log_dirs_soon(1)
    want = here.log_dirs(1)
    api = _api()
    with forced_worker() as worker:
        api.log_dirs_soon(1, _asked(config, worker))
        got = api.log_dirs(1)
    assert got == want
    assert [d.online for d in got] == [True, False] and got[1].error == "KAFKA_STORAGE_ERROR"
    assert got[0].cordoned and got[0].replicas[0].offset_lag == 7
    assert admin.askers == [os.getpid()]  # the child's own call is not seen here


@pytest.mark.parametrize("admin", [True], indirect=True)
def test_the_childs_failure_is_the_ladders_failure(admin: _Admin, config: Config) -> None:
    api = _api()
    with forced_worker() as worker:
        api.log_dirs_soon(1, _asked(config, worker))
        with pytest.raises(LadderCallFailed, match=r"^DescribeLogDirs: ConnectionError: refused$"):
            api.log_dirs(1)


def test_a_child_gone_before_asking_leaves_the_call_to_this_process(
    admin: _Admin, config: Config
) -> None:
    api = _api()
    with forced_worker() as worker:
        worker.close()
        assert ask_in_child(config, worker) is None
    assert ask_in_child(config, None) is None
    api.log_dirs_soon(1, None)
    assert api.log_dirs(1)[0].path == "/data/a"
    assert admin.askers == [os.getpid()]


def test_a_child_killed_while_asking_fails_the_call_in_one_line(
    admin: _Admin, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = os.getpid()

    def hung(topic_partitions: dict[str, list[int]], brokers: list[int]) -> Any:
        if os.getpid() != parent:
            time.sleep(60)  # a broker that never answers: killed before
        return _ANSWER

    monkeypatch.setattr(admin, "describe_log_dirs", hung)
    api = _api()
    with forced_worker() as worker:
        asked = _asked(config, worker)
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        api.log_dirs_soon(1, asked)
        with pytest.raises(LadderCallFailed) as failed:
            api.log_dirs(1)
    assert str(failed.value).startswith("DescribeLogDirs: ChildFailed: ")
    assert "\n" not in str(failed.value)
