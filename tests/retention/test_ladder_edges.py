"""The ladder's edges against a fake broker: write-ahead records, restores, the operator's own
value kept, late evictions forgotten, stalled uploads said once, a bad record file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from diskguard.broker.ladderapi import LadderCallFailed
from diskguard.retention.audit import AuditLog, pair_actions, read_audit
from diskguard.retention.cordon import Cordon
from diskguard.retention.ladder import TopicEviction
from diskguard.retention.ladderstate import LadderState, Lowered
from diskguard.retention.planner import Deletion
from diskguard.retention.requested import RequestedLogStart
from diskguard.retention.tieredrung import TieredRung
from diskguard.retention.uploads import UploadWatch, lags
from support.planning import part


class FakeApi:
    """Topic overrides and cordons as a broker keeps them; ``fail`` makes calls refuse."""

    def __init__(self, state: LadderState | None = None) -> None:
        self.overrides: dict[tuple[str, str], str] = {}
        self.cordons: list[str] | None = []
        self.fail: str | None = None
        self.state = state
        self.seen_recorded: list[bool] = []

    def topic_override(self, topic: str, key: str) -> str | None:
        return self.overrides.get((topic, key))

    def set_topic_config(self, topic: str, key: str, value: str | None) -> None:
        if self.state is not None:  # the record is written before the broker is asked
            self.seen_recorded.append(topic in self.state.lowered())
        if self.fail:
            raise LadderCallFailed(self.fail)
        if value is None:
            self.overrides.pop((topic, key), None)
        else:
            self.overrides[(topic, key)] = value

    def cordoned(self, broker_id: int) -> list[str] | None:
        return None if self.cordons is None else list(self.cordons)

    def cordon(self, broker_id: int, dirs: list[str], add: bool) -> None:
        assert self.cordons is not None
        self.cordons = (
            sorted({*self.cordons, *dirs}) if add else sorted(set(self.cordons) - set(dirs))
        )


def _eviction(topic: str = "t", ms: int = 1000) -> TopicEviction:
    seg = Deletion("/d/kafka", topic, 0, 0, 100, 5, 1024, ("/d/kafka/t-0/0.log",), "/d")
    return TopicEviction(topic, ms, 5, (seg,))


def _rung(tmp_path: Path) -> tuple[TieredRung, FakeApi, LadderState, RequestedLogStart]:
    state = LadderState(tmp_path / "ladder.json")
    api = FakeApi(state)
    requested = RequestedLogStart(tmp_path / "requested.json")
    rung = TieredRung(api, state, AuditLog(tmp_path / "audit.jsonl"), requested)  # type: ignore[arg-type]
    return rung, api, state, requested


def test_an_eviction_is_recorded_before_it_is_asked_and_restored_after(tmp_path: Path) -> None:
    rung, api, state, requested = _rung(tmp_path)
    api.overrides[("t", "local.retention.ms")] = "86400000"
    assert rung.evict(_eviction(), {"/d": 91.0}).ok
    assert api.seen_recorded == [True]
    assert api.overrides[("t", "local.retention.ms")] == "1000"
    assert state.lowered()["t"].previous == "86400000"
    assert requested.waiting("t")
    # A restarted guard reads the record; while the broker has not dropped them, no restore.
    rung2 = TieredRung(api, LadderState(tmp_path / "ladder.json"), rung.audit, requested)  # type: ignore[arg-type]
    rung2.settle(set(), late_after_s=60)
    assert api.overrides[("t", "local.retention.ms")] == "1000"
    requested.forget("t")  # the scan saw them gone
    rung2.settle({"/d"}, late_after_s=60)  # still over its target: kept lowered
    assert api.overrides[("t", "local.retention.ms")] == "1000"
    with capture_logs() as logs:
        rung2.settle(set(), late_after_s=60)
    assert api.overrides[("t", "local.retention.ms")] == "86400000"
    assert [e["event"] for e in logs] == ["tiered_retention_restored"]
    assert LadderState(tmp_path / "ladder.json").lowered() == {}
    kinds = [a.first["kind"] for a in pair_actions(list(read_audit(tmp_path / "audit.jsonl")))]
    assert kinds == ["evict", "restore"]


def test_a_topic_without_an_override_gets_none_back(tmp_path: Path) -> None:
    rung, api, _state, requested = _rung(tmp_path)
    assert rung.evict(_eviction(), {}).ok
    requested.forget("t")
    rung.settle(set(), late_after_s=60)
    assert ("t", "local.retention.ms") not in api.overrides


def test_an_operators_change_is_kept(tmp_path: Path) -> None:
    rung, api, state, requested = _rung(tmp_path)
    rung.evict(_eviction(), {})
    requested.forget("t")
    api.overrides[("t", "local.retention.ms")] = "5000"  # the operator, meanwhile
    with capture_logs() as logs:
        rung.settle(set(), late_after_s=60)
    assert api.overrides[("t", "local.retention.ms")] == "5000"
    assert [e["event"] for e in logs] == ["tiered_restore_skipped"]
    assert state.lowered() == {}


def test_a_second_eviction_never_raises_the_value_and_keeps_the_operators(tmp_path: Path) -> None:
    rung, api, state, _requested = _rung(tmp_path)
    api.overrides[("t", "local.retention.ms")] = "7"
    rung.evict(_eviction(ms=1000), {})
    rung.evict(_eviction(ms=5000), {})  # a later cycle's cutoff: would be higher
    assert api.overrides[("t", "local.retention.ms")] == "1000"
    rung.evict(_eviction(ms=300), {})
    assert api.overrides[("t", "local.retention.ms")] == "300"
    assert state.lowered()["t"].previous == "7"


def test_a_refused_eviction_leaves_no_record(tmp_path: Path) -> None:
    rung, api, state, requested = _rung(tmp_path)
    api.fail = "TOPIC_AUTHORIZATION_FAILED"
    with capture_logs() as logs:
        result = rung.evict(_eviction(), {})
    assert not result.ok and "TOPIC_AUTHORIZATION_FAILED" in (result.error or "")
    assert state.lowered() == {} and not requested.waiting("t")
    assert [e["event"] for e in logs] == ["tiered_eviction_failed"]


def test_an_eviction_the_broker_never_carries_out_stops_counting(tmp_path: Path) -> None:
    rung, _api, state, requested = _rung(tmp_path)
    rung.evict(_eviction(), {})
    with state.change() as data:
        entry = data.lowered["t"]
        data.lowered["t"] = Lowered(entry.key, entry.value, entry.previous, entry.mounts, 0)
    with capture_logs() as logs:
        rung.settle({"/d"}, late_after_s=60)
    assert not requested.waiting("t")
    assert [e["event"] for e in logs] == ["tiered_eviction_late"]


def test_an_unreadable_record_is_said_and_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "ladder.json"
    path.write_text("{not json")
    state = LadderState(path)
    assert state.problem and "unreadable" in state.problem and state.lowered() == {}
    path.write_text(json.dumps({"version": 9}))
    assert "not a version 1" in (LadderState(path).problem or "")


def test_cordons_follow_the_alert_and_only_ours_are_lifted(tmp_path: Path) -> None:
    state = LadderState(tmp_path / "ladder.json")
    api = FakeApi()
    api.cordons = ["/b/kafka"]  # the operator's
    cordon = Cordon(api, 1, state)  # type: ignore[arg-type]
    dirs = {"/a": ["/a/kafka"], "/b": ["/b/kafka"]}
    cordon.converge({"/a": 1, "/b": 0}, dirs, None)
    assert api.cordons == ["/a/kafka", "/b/kafka"] and state.cordoned() == ["/a/kafka"]
    cordon.converge({"/a": 0, "/b": 0}, dirs, None)
    assert api.cordons == ["/b/kafka"] and state.cordoned() == []


def test_no_cordon_setting_is_said_once(tmp_path: Path) -> None:
    api = FakeApi()
    api.cordons = None
    cordon = Cordon(api, 1, LadderState(tmp_path / "ladder.json"))  # type: ignore[arg-type]
    with capture_logs() as logs:
        for _ in range(3):
            cordon.converge({"/a": 1, "/b": 0}, {"/a": ["/a/kafka"], "/b": ["/b/kafka"]}, None)
    assert [e["event"] for e in logs] == ["cordon_unavailable"]


def test_upload_lag_and_a_stall_said_once_then_resumed() -> None:
    p = part("t", 0, [0, 100, 200, 300])
    watch = UploadWatch(stall_after_s=10)
    t0 = time.monotonic()
    assert watch.observe(lags([p], {("t", 0): 99}), t0) == ([], [])
    (lag,) = lags([p], {("t", 0): 99})
    assert lag.segments == 2  # [100, 200) and [200, 300) wait
    stalled, _ = watch.observe(lags([p], {("t", 0): 99}), t0 + 11)
    assert [s.lag.partition for s in stalled] == [0]
    assert watch.observe(lags([p], {("t", 0): 99}), t0 + 30) == ([], [])  # said once
    _, resumed = watch.observe(lags([p], {("t", 0): 199}), t0 + 31)
    assert [r.uploaded_offset for r in resumed] == [199]


@pytest.mark.parametrize("uploaded", [299, 10_000])
def test_nothing_waiting_is_no_stall(uploaded: int) -> None:
    p = part("t", 0, [0, 100, 200, 300])
    watch = UploadWatch(stall_after_s=1)
    assert watch.observe(lags([p], {("t", 0): uploaded}), 0.0) == ([], [])
    assert watch.observe(lags([p], {("t", 0): uploaded}), 100.0) == ([], [])


def test_a_brokers_every_dir_is_never_cordoned(tmp_path: Path) -> None:
    """A single-dir broker, or every dir filling: cordoning them all would keep the whole
    broker from new replicas (a cluster decision), so none is, and that is said once."""
    api = FakeApi()
    state = LadderState(tmp_path / "ladder.json")
    cordon = Cordon(api, 1, state)  # type: ignore[arg-type]
    with capture_logs() as logs:
        cordon.converge({"/a": 2}, {"/a": ["/a/kafka"]}, None)
        cordon.converge({"/a": 2}, {"/a": ["/a/kafka"]}, None)
    assert api.cordons == [] and state.cordoned() == []
    assert [e["event"] for e in logs] == ["cordon_skipped"]
    # Two dirs, both filling: ours is lifted, none set.
    dirs = {"/a": ["/a/kafka"], "/b": ["/b/kafka"]}
    cordon.converge({"/a": 1, "/b": 0}, dirs, None)
    assert api.cordons == ["/a/kafka"]
    cordon.converge({"/a": 1, "/b": 1}, dirs, None)
    assert api.cordons == [] and state.cordoned() == []
