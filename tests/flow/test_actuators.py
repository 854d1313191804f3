"""Actuators on real things: real hook processes, the real tansu broker, crash + reconcile.

tansu (0.6.0, checked here) implements neither client quotas nor ACL management: its
ApiVersions lists no DescribeClientQuotas (48) / AlterClientQuotas (49) / DeleteAcls (31), so
kafka-python refuses those with IncompatibleBrokerVersion, and it lists CreateAcls (30) but
answers it with a response librdkafka cannot parse — and librdkafka then *aborts the
process* (a C assertion). The acl actuator runs its confluent-kafka calls in a child process
for that reason; the test below shows the daemon's side surviving it. The protocol handling
itself is tested against fakes at the client boundary (kafka-python quota request objects;
confluent-kafka ``AclBinding``s and futures), injected through the constructor. Against a real
Apache Kafka broker: tests/broker/test_realkafka.py (DISKGUARD_KAFKA_HOME).
"""

from __future__ import annotations

import contextlib
import io
import json
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from kafka.errors import IncompatibleBrokerVersion
from kafka.protocol.admin import AlterClientQuotasRequest

from diskguard.config import Config, parse_config
from diskguard.flow.actuator import STATE_FILE, ActuatorError, QuotaEntity
from diskguard.flow.holds import deny_write
from diskguard.flow.kafkaacl import ConfluentAclAdmin
from diskguard.flow.kafkaquota import KafkaAdminConnection, KafkaQuotaAdmin
from diskguard.flow.reconcile import Actuators
from diskguard.flow.state import FlowLimits, FlowState, Transition, step
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import configure_logging
from support.fakes import FakeConfluentAdmin, FakeQuotaBroker
from support.tansu import run_tansu

GiB = 1024**3
USER_DEFAULT: QuotaEntity = (("user", None),)
CLIENT_DEFAULT: QuotaEntity = (("client-id", None),)


# ----------------------------------------------------------------------------- helpers


@pytest.fixture()
def logs() -> Iterator[io.StringIO]:
    """The daemon's real JSON logging into a buffer; the previous config objects restored
    afterwards (loggers bound elsewhere keep references to them, e.g. for capture_logs)."""
    saved = structlog.get_config()
    buf = io.StringIO()
    configure_logging("json", "debug", stream=buf)
    try:
        yield buf
    finally:
        structlog.configure(**saved)


def events(buf: io.StringIO, name: str) -> list[dict[str, Any]]:
    return [
        rec
        for rec in (json.loads(line) for line in buf.getvalue().splitlines() if line.strip())
        if rec.get("event") == name
    ]


def make_config(tmp_path: Path, **flow: Any) -> Config:
    bootstrap = flow.pop("bootstrap", None)
    if bootstrap is None and {"quota", "acl"} & set(flow.get("actuators", ())):
        # The config requires an address for these; the tests inject the admin clients.
        bootstrap = "127.0.0.1:9"
    logs = tmp_path / "kafka-logs"  # the state dir goes beside it, never inside
    logs.mkdir(exist_ok=True)
    return parse_config(
        {
            "broker": {
                "log_dirs": [str(logs)],
                "bootstrap_servers": bootstrap,
            },
            "flow_control": {"overfull_percent": 90, "underfull_percent": 80, **flow},
            "daemon": {"state_dir": str(tmp_path / "state")},
        },
        tmp_path / "diskguard.toml",
    )


def transition(event: str, mount: str = "/data", percent: float = 95.0) -> Transition:
    total = 100 * GiB
    used = int(total * percent / 100)
    limits = FlowLimits(overfull_percent=90, underfull_percent=80, min_free_bytes=0)
    usage = FilesystemUsage(mount, "/dev/x", total, used, total - used)
    before = FlowState(overfull=event == "overfull_cleared", alert_level=None)
    _, out = step(before, usage, limits)
    (found,) = [t for t in out if t.event == event]
    return found


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# ----------------------------------------------------------------------------- exec hook


def test_exec_hook_gets_the_event_env_in_order(tmp_path: Path, logs: io.StringIO) -> None:
    record = tmp_path / "env.log"
    hook = script(
        tmp_path,
        "hook.sh",
        f'echo "$DISKGUARD_EVENT|$DISKGUARD_MOUNT|$DISKGUARD_USAGE_PERCENT|'
        f'$DISKGUARD_FREE_BYTES" >> {record}\necho said-something\n',
    )
    cfg = make_config(tmp_path, actuators=["exec"], on_change=[str(hook)])
    acts = Actuators(cfg)
    try:
        over = transition("overfull", percent=95.0)
        cleared = transition("overfull_cleared", percent=70.0)
        acts.apply(over)
        acts.apply(cleared)
        alert = Transition("disk_alert", "/data", "low", 75.0, 1, level=1, previous_level=0)
        acts.apply(alert)  # alerts do not run the hook
        assert acts.wait_idle(20)
    finally:
        acts.close()
    lines = record.read_text().splitlines()
    assert lines == [
        f"overfull|/data|95.00|{over.free_bytes}",
        f"overfull_cleared|/data|70.00|{cleared.free_bytes}",
    ]
    finished = events(logs, "hook_finished")
    assert [f["exit_code"] for f in finished] == [0, 0]
    assert finished[0]["stdout"].strip() == "said-something"
    assert acts.failure_counts()["exec"] == 0


def test_hung_hook_is_killed_and_never_blocks_the_caller(tmp_path: Path, logs: io.StringIO) -> None:
    pidfile = tmp_path / "child.pid"
    # The hook starts a grandchild in its own process group: the timeout must kill both.
    hook = script(tmp_path, "hang.sh", f"sleep 300 &\necho $! > {pidfile}\nwait\n")
    cfg = make_config(tmp_path, actuators=["exec"], on_change=[str(hook)], on_change_timeout=1)
    acts = Actuators(cfg)
    try:
        acts.apply(transition("overfull"))
        acts.apply(transition("overfull_cleared", percent=50))
        # The hooks run one after the other, each until its 1 s timeout kills it: had apply
        # waited for its hook, both would be over by now (a count, not a stopwatch).
        assert len(events(logs, "hook_finished")) < 2, "apply waited for the hook"
        assert acts.wait_idle(30), "the hung hooks were not killed"
    finally:
        acts.close()
    failed = events(logs, "actuator_failed")
    assert len(failed) == 2 and all("timeout" in f["error"] for f in failed)
    assert acts.failure_counts()["exec"] == 2
    assert all(f["timed_out"] for f in events(logs, "hook_finished"))
    assert not _alive(int(pidfile.read_text())), "the hook's child survived the timeout"


def _alive(pid: int) -> bool:
    """Running (a killed orphan may linger as a zombie until init reaps it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def test_failing_and_missing_hooks_are_logged_not_raised(tmp_path: Path, logs: io.StringIO) -> None:
    hook = script(tmp_path, "fail.sh", "echo boom >&2\nexit 3\n")
    failures: list[str] = []
    cfg = make_config(tmp_path, actuators=["exec"], on_change=[str(hook)])
    acts = Actuators(cfg, on_failure=failures.append)
    acts.apply(transition("overfull"))
    assert acts.wait_idle(20)
    acts.close()
    gone = script(tmp_path, "gone.sh", "exit 0\n")
    missing = make_config(tmp_path, actuators=["exec"], on_change=[str(gone)])
    gone.unlink()  # the config check catches a missing hook; one removed later fails at run time
    acts2 = Actuators(missing, on_failure=failures.append)
    acts2.apply(transition("overfull"))
    assert acts2.wait_idle(20)
    acts2.close()
    failed = events(logs, "actuator_failed")
    assert failed[0]["error"] == "hook exited with code 3"
    assert "cannot run" in failed[1]["error"]
    assert events(logs, "hook_finished")[0]["stderr"].strip() == "boom"
    assert failures == ["exec", "exec"]


# ----------------------------------------------------------------------------- quota


class LaggingQuotaBroker(FakeQuotaBroker):
    """A KRaft broker: DescribeClientQuotas answers from a metadata image that takes each
    accepted alter ``lag`` requests later (never, with ``lag=None``)."""

    def __init__(self, quotas: dict[QuotaEntity, float] | None = None, lag: int | None = 3):
        super().__init__(quotas)
        self.image = dict(self.quotas)
        self.lag = lag
        self.pending: list[list[Any]] = []  # [requests to go, quotas after an alter]

    def send(self, request: Any) -> Any:
        for entry in self.pending:
            entry[0] -= 1
        while self.pending and self.pending[0][0] <= 0:
            self.image = self.pending.pop(0)[1]
        if isinstance(request, AlterClientQuotasRequest):
            answer = super().send(request)
            if self.lag is not None:
                self.pending.append([self.lag, dict(self.quotas)])
            return answer
        truth, self.quotas = self.quotas, self.image
        try:
            return super().send(request)
        finally:
            self.quotas = truth


def test_a_quota_change_is_done_only_once_the_broker_shows_it(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """Measured on Kafka 4.4 (KRaft): a describe right after an accepted alter still gave the
    old value. A restore taken as done at once lets a quick next episode read diskguard's own
    throttle as the value to restore, and keep it for good; so an alter waits until a
    describe shows it, and one never shown is a failure, retried."""
    broker = LaggingQuotaBroker({USER_DEFAULT: 4096.0}, lag=3)
    acts = quota_actuators(tmp_path, broker)
    acts.apply(transition("overfull"), topics=["orders"])
    acts.apply(transition("overfull_cleared", percent=50))
    acts.apply(transition("overfull"), topics=["orders"])  # at once: the image lags
    acts.apply(transition("overfull_cleared", percent=50))
    assert broker.quotas == {USER_DEFAULT: 4096.0}, "diskguard's own throttle was kept"
    assert acts.failure_counts()["quota"] == 0

    never = LaggingQuotaBroker({}, lag=None)
    (tmp_path / "b").mkdir()
    stuck = Actuators(
        make_config(tmp_path / "b", actuators=["quota"], quota={"producer_byte_rate": 1024}),
        quota_admin=KafkaQuotaAdmin(never.send, visible_within_s=0.2, poll_s=0.01),
        background=False,
    )
    stuck.apply(transition("overfull"), topics=["orders"])
    failed = [e for e in events(logs, "actuator_failed") if e["actuator"] == "quota"]
    assert failed and "still gives producer_byte_rate None" in failed[-1]["error"], failed
    assert not stuck.converged


def test_a_quota_restore_shown_late_is_said_by_a_later_pass(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """A restore the broker shows only after the wait: ``actuator_failed`` then, and the
    ledger keeps the value to restore, so a later pass restores again (idempotent) and says
    ``quota_restored`` once per entity, with exactly the value there before."""
    broker = LaggingQuotaBroker({USER_DEFAULT: 4096.0}, lag=0)
    acts = quota_actuators(tmp_path, broker, visible_within_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    assert len(events(logs, "quota_applied")) == 2
    broker.lag = None  # accepted, not shown
    acts.apply(transition("overfull_cleared", percent=50))
    assert [e["action"] for e in events(logs, "actuator_failed")] == ["restore"]
    assert events(logs, "quota_restored") == []
    state = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert state["quota"]["previous"], "the value to restore was dropped"
    broker.image, broker.lag = dict(broker.quotas), 0  # replayed it; shows changes again
    for _ in range(3):
        acts.reconcile({"/data": False})
    restored = events(logs, "quota_restored")
    assert sorted((e["entity"], e["producer_byte_rate"]) for e in restored) == [
        ("client-id=<default>", None),
        ("user=<default>", 4096.0),
    ]
    assert broker.quotas == {USER_DEFAULT: 4096.0}
    assert acts.converged


def said(buf: io.StringIO, key: str) -> list[str]:
    """The ``quota_applied`` / ``quota_restored`` events for one entity key, in order."""
    return [
        rec["event"]
        for rec in (json.loads(line) for line in buf.getvalue().splitlines() if line.strip())
        if rec.get("event") in ("quota_applied", "quota_restored") and rec.get("entity") == key
    ]


@pytest.mark.parametrize("restart", [False, True], ids=["same-process", "restarted"])
def test_a_throttle_needed_again_before_its_restore_shows_is_one_hold(
    tmp_path: Path, logs: io.StringIO, restart: bool
) -> None:
    """Overfull again while the restore is not shown yet (the broker still gives the
    throttle): the hold never visibly lifted, so neither ``quota_restored`` nor a second
    ``quota_applied``; the one ``quota_restored`` comes with the release that shows. The
    restore of the second entity was never even sent (the first one failed): the same."""
    broker = LaggingQuotaBroker({USER_DEFAULT: 4096.0}, lag=0)
    acts = quota_actuators(tmp_path, broker, visible_within_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    broker.lag = None  # accepted, not shown
    acts.apply(transition("overfull_cleared", percent=50))
    assert [e["action"] for e in events(logs, "actuator_failed")] == ["restore"]
    if restart:
        del acts  # kill -9: the restarted guard says its hold once more (a new process)
        acts = quota_actuators(tmp_path, broker, visible_within_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    again = ["quota_applied"] if restart else []
    for key in ("client-id=<default>", "user=<default>"):
        assert said(logs, key) == ["quota_applied", *again], said(logs, key)
    broker.image, broker.lag = dict(broker.quotas), 0
    acts.apply(transition("overfull_cleared", percent=50))
    for key in ("client-id=<default>", "user=<default>"):
        assert said(logs, key) == ["quota_applied", *again, "quota_restored"], said(logs, key)
    assert broker.quotas == {USER_DEFAULT: 4096.0}
    assert acts.converged


@pytest.mark.parametrize("restart", [False, True], ids=["same-process", "restarted"])
def test_a_restore_shown_late_then_needed_again_is_said_restored_first(
    tmp_path: Path, logs: io.StringIO, restart: bool
) -> None:
    """The restore the broker showed only after the wait (and before the next overfull): the
    throttle was visibly gone, so the pass that needs it again says ``quota_restored`` (what
    is known now) before its ``quota_applied``; the entity whose restore was never sent
    stays one hold. Across a restart too: ``actuators.json`` says which throttles were said."""
    broker = LaggingQuotaBroker({USER_DEFAULT: 4096.0}, lag=0)
    acts = quota_actuators(tmp_path, broker, visible_within_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    broker.lag = None
    acts.apply(transition("overfull_cleared", percent=50))  # client-id's restore not shown
    broker.image, broker.lag = dict(broker.quotas), 0  # now it is
    assert CLIENT_DEFAULT not in broker.image
    if restart:
        del acts
        acts = quota_actuators(tmp_path, broker, visible_within_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    assert said(logs, "client-id=<default>") == [
        "quota_applied",
        "quota_restored",
        "quota_applied",
    ]
    restored = events(logs, "quota_restored")
    assert restored[0]["producer_byte_rate"] is None
    user = ["quota_applied", "quota_applied"] if restart else ["quota_applied"]
    assert said(logs, "user=<default>") == user
    acts.apply(transition("overfull_cleared", percent=50))
    assert said(logs, "client-id=<default>")[-1] == "quota_restored"
    assert said(logs, "user=<default>") == [*user, "quota_restored"]
    assert broker.quotas == {USER_DEFAULT: 4096.0}


def test_a_throttle_shown_late_is_said_by_a_later_pass(tmp_path: Path, logs: io.StringIO) -> None:
    """A throttle accepted but shown only after the wait: ``actuator_failed``, no
    ``quota_applied`` yet; the pass that sees it says ``quota_applied`` once per entity, with
    the value from before (recorded ahead of the alter), never the throttle itself."""
    broker = LaggingQuotaBroker({USER_DEFAULT: 4096.0}, lag=None)
    acts = quota_actuators(tmp_path, broker, visible_within_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    assert [e["action"] for e in events(logs, "actuator_failed")] == ["throttle"]
    assert events(logs, "quota_applied") == []
    broker.image, broker.lag = dict(broker.quotas), 0
    for _ in range(3):
        acts.reconcile({"/data": True})
    applied = events(logs, "quota_applied")
    assert sorted((e["entity"], e["previous"]) for e in applied) == [
        ("client-id=<default>", None),
        ("user=<default>", 4096.0),
    ]
    acts.apply(transition("overfull_cleared", percent=50))
    assert broker.quotas == {USER_DEFAULT: 4096.0}


def quota_actuators(
    tmp_path: Path, broker: FakeQuotaBroker, visible_within_s: float = 5.0, **kw: Any
) -> Actuators:
    """One guard alone; ``visible_within_s``: how long an alter waits for a describe to show
    it."""
    cfg = make_config(tmp_path, actuators=["quota"], quota={"producer_byte_rate": "1KiB"})
    admin = KafkaQuotaAdmin(broker.send, visible_within_s=visible_within_s, poll_s=0.01)
    return Actuators(cfg, quota_admin=admin, background=False, **kw)


def test_quota_throttles_and_restores_previous_values(tmp_path: Path, logs: io.StringIO) -> None:
    broker = FakeQuotaBroker({USER_DEFAULT: 4096.0, (("user", "strict"),): 100.0})
    acts = quota_actuators(tmp_path, broker)
    acts.apply(transition("overfull"), topics=["orders"])
    assert broker.quotas == {
        USER_DEFAULT: 1024.0,
        CLIENT_DEFAULT: 1024.0,
        (("user", "strict"),): 100.0,
    }
    kinds = [type(r).__name__ for r in broker.requests]
    assert kinds.index("DescribeClientQuotasRequest") < kinds.index("AlterClientQuotasRequest")
    saved = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert saved["quota"]["applied"] is True
    assert {(tuple(map(tuple, p["entity"])), p["value"]) for p in saved["quota"]["previous"]} == {
        ((("client-id", None),), None),
        ((("user", None),), 4096.0),
    }
    acts.apply(transition("overfull_cleared", percent=50))
    assert broker.quotas == {USER_DEFAULT: 4096.0, (("user", "strict"),): 100.0}
    saved = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert saved["quota"] == {"applied": False, "previous": [], "said": []}
    assert acts.failure_counts()["quota"] == 0
    assert len(events(logs, "quota_applied")) == 2 and len(events(logs, "quota_restored")) == 2


def test_quota_never_loosens_a_stricter_existing_quota(tmp_path: Path) -> None:
    broker = FakeQuotaBroker({USER_DEFAULT: 100.0})
    cfg = make_config(
        tmp_path,
        actuators=["quota"],
        quota={"producer_byte_rate": 1024, "entities": [{"user": None}]},
    )
    acts = Actuators(cfg, quota_admin=KafkaQuotaAdmin(broker.send), background=False)
    acts.apply(transition("overfull"))
    assert broker.quotas == {USER_DEFAULT: 100.0}
    acts.apply(transition("overfull_cleared", percent=10))
    assert broker.quotas == {USER_DEFAULT: 100.0}


def test_quota_error_code_is_logged_counted_and_retried(tmp_path: Path, logs: io.StringIO) -> None:
    broker = FakeQuotaBroker()
    broker.fail_next = [31]  # CLUSTER_AUTHORIZATION_FAILED on the first alter
    failures: list[str] = []
    acts = quota_actuators(tmp_path, broker, on_failure=failures.append)
    acts.apply(transition("overfull"))
    (failed,) = events(logs, "actuator_failed")
    assert failed["actuator"] == "quota"
    assert "ClusterAuthorizationFailedError" in failed["error"] and "31" in failed["error"]
    assert failures == ["quota"] and not acts.converged
    # The next cycle's reconcile is the retry.
    acts.reconcile({"/data": True}, {"/data": ["orders"]})
    assert acts.converged
    assert broker.quotas == {USER_DEFAULT: 1024.0, CLIENT_DEFAULT: 1024.0}


def test_crash_after_throttle_is_undone_by_the_next_daemon(tmp_path: Path) -> None:
    broker = FakeQuotaBroker({USER_DEFAULT: 4096.0})
    first = quota_actuators(tmp_path, broker)
    first.apply(transition("overfull"))
    assert broker.quotas[USER_DEFAULT] == 1024.0
    del first  # kill -9: nothing is cleaned up, only actuators.json survives
    # Restarted while still overfull: the throttle is re-sent but the recorded "previous"
    # (4096) is kept, not replaced by our own 1024.
    second = quota_actuators(tmp_path, broker)
    broker.requests.clear()
    second.reconcile({"/data": True})
    # Not asked for the value to restore again (only, after each alter, to see it applied).
    kinds = [type(r).__name__ for r in broker.requests]
    assert kinds[0] == "AlterClientQuotasRequest", kinds
    assert broker.quotas[USER_DEFAULT] == 1024.0
    del second
    # Restarted after the disk cleared while we were down: the first reconcile restores.
    third = quota_actuators(tmp_path, broker)
    third.reconcile({"/data": False})
    assert broker.quotas == {USER_DEFAULT: 4096.0}


def test_crash_between_record_and_alter_restores_cleanly(tmp_path: Path) -> None:
    broker = FakeQuotaBroker({USER_DEFAULT: 4096.0})
    broker.fail_next = [1]  # the alter "never happened"
    first = quota_actuators(tmp_path, broker)
    first.apply(transition("overfull"))
    del first
    second = quota_actuators(tmp_path, broker)
    second.reconcile({"/data": False})
    assert broker.quotas == {USER_DEFAULT: 4096.0}
    assert second.converged


def test_quota_dropped_from_config_still_restores(tmp_path: Path, logs: io.StringIO) -> None:
    broker = FakeQuotaBroker({USER_DEFAULT: 4096.0})
    quota_actuators(tmp_path, broker).apply(transition("overfull"))
    # Restart with the quota actuator removed from the config but an admin still reachable.
    cfg = make_config(tmp_path, actuators=[])
    acts = Actuators(cfg, quota_admin=KafkaQuotaAdmin(broker.send), background=False)
    acts.reconcile({"/data": True})
    assert broker.quotas == {USER_DEFAULT: 4096.0}


# ----------------------------------------------------------------------------- acl


def acl_actuators(
    tmp_path: Path,
    admin: FakeConfluentAdmin,
    permissive: bool | None = False,
    timeout_s: float = 10.0,
) -> Actuators:
    """One guard alone; ``permissive``: what the broker's ``allow.everyone.if.no.acl.found``
    is known to be (False: a topic without ACLs is closed to all but super users anyway);
    ``timeout_s``: how long a create or delete waits for DescribeAcls to show it."""
    cfg = make_config(tmp_path, actuators=["acl"], acl_principal="User:producer")
    return Actuators(
        cfg,
        acl_admin=ConfluentAclAdmin(admin, timeout_s),
        background=False,
        acl_permissive=permissive,
    )


def test_acl_denies_writes_on_the_overfull_mounts_topics(tmp_path: Path) -> None:
    admin = FakeConfluentAdmin()
    acts = acl_actuators(tmp_path, admin)
    acts.apply(transition("overfull", mount="/a"), topics=["orders", "clicks"])
    assert admin.acls == {
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            "User:producer",
            "*",
            AclOperation.WRITE,
            AclPermissionType.DENY,
        )
        for topic in ("orders", "clicks")
    }
    # A topic created while overfull is picked up by the next reconcile; another mount's
    # topics come and go with that mount.
    acts.reconcile({"/a": True, "/b": True}, {"/a": ["orders", "clicks", "new"], "/b": ["logs"]})
    assert admin.topics() == {"orders", "clicks", "new", "logs"}
    acts.apply(transition("overfull_cleared", mount="/a", percent=10))
    assert admin.topics() == {"logs"}
    acts.reconcile({"/a": False, "/b": False})
    assert admin.topics() == set()
    assert json.loads((tmp_path / "state" / STATE_FILE).read_text())["acl"] == []


def test_acl_release_waits_until_the_broker_no_longer_lists_it(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """A KRaft broker lists a deleted ACL until it has replayed the removal: ``acl_removed``
    comes once DescribeAcls no longer lists it. One listed for ever is a failed release."""
    admin = FakeConfluentAdmin()
    acts = acl_actuators(tmp_path, admin)
    acts.apply(transition("overfull"), topics=["orders"])
    admin.delete_lag = 3
    acts.apply(transition("overfull_cleared", percent=10))
    assert events(logs, "acl_removed") and events(logs, "actuator_failed") == []
    assert admin.describe_acls(ConfluentAclAdmin._native(None, exact=True)).result() == []

    stuck = FakeConfluentAdmin()
    stuck.delete_lag = None
    quick = ConfluentAclAdmin(stuck, timeout_s=0.3)
    binding = deny_write("orders", "User:producer")
    quick.create([binding])
    with pytest.raises(ActuatorError, match="DeleteAcls was accepted but DescribeAcls still"):
        quick.delete([binding])


def test_acl_removal_shown_only_after_the_wait_is_said_by_a_later_pass(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """A removal the broker lists until after DeleteAcls gave up waiting: the release was an
    ``actuator_failed``, and the operator's log must not end there with the hold looking
    never lifted. The state says the removal is not seen yet; a later pass that no longer
    finds the ACL says ``acl_removed``, once."""
    admin = FakeConfluentAdmin()
    acts = acl_actuators(tmp_path, admin, timeout_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    binding = deny_write("orders", "User:producer")
    admin.delete_lag = None  # listed until ``replay``
    acts.apply(transition("overfull_cleared", percent=10))
    failed = events(logs, "actuator_failed")
    assert [e["action"] for e in failed] == ["remove"], failed
    assert events(logs, "acl_removed") == []
    state = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert state["acl_removing"] == [binding.to_json()]
    assert not acts.converged

    acts.reconcile({"/data": False})  # still listed: nothing said, still pending
    assert events(logs, "acl_removed") == []
    admin.replay()
    for _ in range(4):  # gone: said once (a binding missed twice, as any owned ACL)
        acts.reconcile({"/data": False})
    removed = events(logs, "acl_removed")
    assert [(e["topics"], e["principal"]) for e in removed] == [(["orders"], "User:producer")]
    state = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert state["acl_removing"] == [] and state["acl_owned"] == []
    assert acts.converged


def test_acl_removal_pending_across_a_restart_is_said_when_seen(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """The pending removal is in ``actuators.json``: a guard restarted before the broker showed
    it still says ``acl_removed`` when it does."""
    admin = FakeConfluentAdmin()
    acts = acl_actuators(tmp_path, admin, timeout_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    admin.delete_lag = None
    acts.apply(transition("overfull_cleared", percent=10))
    del acts  # kill -9
    admin.replay()
    restarted = acl_actuators(tmp_path, admin, timeout_s=0.2)
    for _ in range(3):
        restarted.reconcile({"/data": False})
    assert [e["topics"] for e in events(logs, "acl_removed")] == [["orders"]]
    assert admin.acls == set()


def test_acl_needed_again_before_its_removal_shows_is_one_hold(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """Overfull again while the broker still lists the ACL whose removal this guard asked
    for: the hold never visibly lifted, so neither ``acl_removed`` nor a second
    ``acl_applied``. The ACL is created again all the same: the DeleteAcls the broker
    accepted may still land (a KRaft broker replays it late), and must not lift a hold
    that is needed; the create comes after it. The one ``acl_removed`` comes with the
    release that shows."""
    admin = FakeConfluentAdmin()
    acts = acl_actuators(tmp_path, admin, timeout_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    admin.delete_lag = None  # listed until ``replay``
    acts.apply(transition("overfull_cleared", percent=10))
    assert [e["action"] for e in events(logs, "actuator_failed")] == ["remove"]
    acts.apply(transition("overfull"), topics=["orders"])
    assert [e["topics"] for e in events(logs, "acl_applied")] == [["orders"]]
    assert events(logs, "acl_removed") == []
    state = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert state["acl_removing"] == []
    admin.replay()  # the accepted removal lands now
    assert admin.topics() == {"orders"}, "the late removal lifted a hold that is needed"
    admin.delete_lag = 0
    for _ in range(2):
        acts.reconcile({"/data": True}, {"/data": ["orders"]})
    acts.apply(transition("overfull_cleared", percent=10))
    assert [e["topics"] for e in events(logs, "acl_applied")] == [["orders"]]
    assert [e["topics"] for e in events(logs, "acl_removed")] == [["orders"]]
    assert admin.topics() == set()
    assert acts.converged


def test_acl_removal_shown_then_needed_again_is_said_removed_first(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """The removal shown after the wait, before the next overfull: the hold was visibly
    gone, so ``acl_removed`` (once), then ``acl_applied`` for the new one."""
    admin = FakeConfluentAdmin()
    acts = acl_actuators(tmp_path, admin, timeout_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    admin.delete_lag = None
    acts.apply(transition("overfull_cleared", percent=10))
    admin.replay()
    acts.apply(transition("overfull"), topics=["orders"])
    order = [
        rec["event"]
        for rec in (json.loads(line) for line in logs.getvalue().splitlines() if line.strip())
        if rec.get("event") in ("acl_applied", "acl_removed")
    ]
    assert order == ["acl_applied", "acl_removed", "acl_applied"]
    assert admin.topics() == {"orders"}


def test_acl_creation_shown_late_is_applied_by_a_later_pass(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """A CreateAcls accepted but listed only after the wait: a failure then, ``acl_applied``
    from the pass that finds it listed (once)."""
    admin = FakeConfluentAdmin()
    admin.forget = True  # accepted, not listed
    acts = acl_actuators(tmp_path, admin, timeout_s=0.2)
    acts.apply(transition("overfull"), topics=["orders"])
    assert [e["action"] for e in events(logs, "actuator_failed")] == ["deny"]
    assert events(logs, "acl_applied") == []
    admin.forget = False
    admin.acls.add(ConfluentAclAdmin._native(deny_write("orders", "User:producer"), False))
    for _ in range(3):
        acts.reconcile({"/data": True}, {"/data": ["orders"]})
    assert [e["topics"] for e in events(logs, "acl_applied")] == [["orders"]]
    assert acts.converged


def test_acl_failure_is_retried_and_crash_is_reconciled(tmp_path: Path, logs: io.StringIO) -> None:
    admin = FakeConfluentAdmin()
    admin.fail_creates = 1
    acts = acl_actuators(tmp_path, admin)
    acts.apply(transition("overfull"), topics=["orders"])
    assert events(logs, "actuator_failed")[0]["actuator"] == "acl"
    assert admin.topics() == set()
    acts.reconcile({"/data": True}, {"/data": ["orders"]})
    assert admin.topics() == {"orders"}
    del acts  # kill -9
    restarted = acl_actuators(tmp_path, admin)
    restarted.reconcile({"/data": False}, {"/data": ["orders"]})
    assert admin.topics() == set()


def test_unknown_mount_state_keeps_what_was_recorded(tmp_path: Path) -> None:
    admin = FakeConfluentAdmin()
    acl_actuators(tmp_path, admin).apply(transition("overfull"), topics=["orders"])
    restarted = acl_actuators(tmp_path, admin)
    restarted.reconcile({"/data": None})  # not observed yet after the restart
    assert admin.topics() == {"orders"}
    restarted.reconcile({})  # the mount is no longer watched at all: released
    assert admin.topics() == set()


# ----------------------------------------------------------------------------- real broker


def tansu() -> contextlib.AbstractContextManager[str]:
    """A real tansu broker for the block (the shared helper in ``tests/support/tansu.py``)."""
    return run_tansu()


def test_real_broker_without_quota_or_acl_support(tmp_path: Path, logs: io.StringIO) -> None:
    with tansu() as bootstrap:
        cfg = make_config(
            tmp_path, actuators=["quota", "acl"], bootstrap=bootstrap, acl_principal="User:*"
        )
        # What tansu answers, at the client boundary.
        connection = KafkaAdminConnection(cfg.broker, timeout_s=2)
        with pytest.raises(Exception) as describe_error:
            connection.quota_admin().describe_producer_byte_rate(USER_DEFAULT)
        assert type(describe_error.value).__name__ == "IncompatibleBrokerVersion"
        connection.reset()

        failures: list[str] = []
        acts = Actuators(
            cfg,
            on_failure=failures.append,
            broker_timeout_s=2,
            retry_interval_s=60,
            acl_permissive=False,  # a topic without ACLs gets the DENY alone
        )
        try:
            # apply only queues (its worker meets the broker; that it never blocks the caller
            # is test_hung_hook_is_killed_and_never_blocks_the_caller's): no clock read here.
            acts.apply(transition("overfull"), topics=["orders"])
            assert acts.wait_idle(60)
            assert not acts.converged
            failed = {f["actuator"]: f["error"] for f in events(logs, "actuator_failed")}
            assert "not supported by the broker" in failed["quota"]
            assert "DescribeClientQuotas" in failed["quota"]
            # librdkafka aborted on tansu's CreateAcls answer — in the child, not here.
            assert "CreateAcls" in failed["acl"] and "aborted (SIGABRT)" in failed["acl"]
            assert set(failures) == {"quota", "acl"}
            # What was attempted is recorded, so a later daemon (or this one) undoes it.
            saved = json.loads((tmp_path / "state" / STATE_FILE).read_text())
            assert saved["overfull"] == {"/data": ["orders"]}
            assert saved["acl_owned"] == [
                ["TOPIC", "orders", "LITERAL", "User:*", "*", "WRITE", "DENY"]
            ]
        finally:
            acts.close()


def test_missing_quota_api_is_one_line_per_episode_not_retried(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """A broker before Kafka 2.6 has no client-quota API (what 2.2 answers: kafka-python's
    IncompatibleBrokerVersion). Retrying cannot help: one counted line per overfull episode,
    nothing recorded, and the pass counts as converged (the acl actuator is not held up)."""

    def send(request: Any) -> Any:
        raise IncompatibleBrokerVersion(
            f"Kafka broker does not support the '{type(request).__name__}' Kafka protocol."
        )

    failures: list[str] = []
    cfg = make_config(tmp_path, actuators=["quota"], quota={"producer_byte_rate": 1024})
    acts = Actuators(
        cfg, quota_admin=KafkaQuotaAdmin(send), background=False, on_failure=failures.append
    )
    acts.apply(transition("overfull"), topics=["orders"])
    acts.reconcile({"/data": True}, {"/data": ["orders"]})
    acts.reconcile({"/data": True}, {"/data": ["orders", "new"]})
    (failed,) = events(logs, "actuator_failed")
    assert failed["actuator"] == "quota" and failed["action"] == "throttle"
    assert failed["error"].startswith("DescribeClientQuotas/AlterClientQuotas not supported")
    assert failures == ["quota"] and acts.failure_counts()["quota"] == 1
    assert acts.converged
    assert acts.applied()["quota"] == {"applied": False, "previous": [], "said": []}  # nothing
    assert not (tmp_path / "state" / STATE_FILE).exists()
    # Cleared, then a new episode: said once more.
    acts.apply(transition("overfull_cleared", percent=10))
    acts.apply(transition("overfull"), topics=["orders"])
    assert len(events(logs, "actuator_failed")) == 2


def test_acl_accepted_but_not_held_is_a_failure(tmp_path: Path, logs: io.StringIO) -> None:
    admin = FakeConfluentAdmin()
    admin.forget = True
    acts = acl_actuators(tmp_path, admin)
    acts.apply(transition("overfull"), topics=["orders"])
    (failed,) = events(logs, "actuator_failed")
    assert (
        "DescribeAcls does not list 1 of them, e.g. DENY WRITE User:producer@*" in (failed["error"])
    )
    assert not acts.converged


def test_acl_broker_error_names_the_kafka_error(tmp_path: Path, logs: io.StringIO) -> None:
    admin = FakeConfluentAdmin()
    admin.fail_creates = 1
    acl_actuators(tmp_path, admin).apply(transition("overfull"), topics=["orders"])
    (failed,) = events(logs, "actuator_failed")
    assert failed["error"] == (
        "CreateAcls failed for 1 of 1 ACL(s): topic 'orders': SECURITY_DISABLED: no authorizer"
    )


def test_overfull_without_topics_keeps_recorded_topics(tmp_path: Path) -> None:
    admin = FakeConfluentAdmin()
    acl_actuators(tmp_path, admin).apply(transition("overfull"), topics=["orders"])
    restarted = acl_actuators(tmp_path, admin)
    assert restarted.recorded_overfull_mounts() == {"/data"}
    restarted.apply(transition("overfull"), topics=[])  # no scan yet after the restart
    assert admin.topics() == {"orders"}


def test_background_worker_retries_on_its_own(tmp_path: Path, logs: io.StringIO) -> None:
    broker = FakeQuotaBroker({USER_DEFAULT: 4096.0})
    broker.fail_next = [31, 31]  # two failed passes, then the broker accepts
    cfg = make_config(tmp_path, actuators=["quota"], quota={"producer_byte_rate": 1024})
    acts = Actuators(cfg, quota_admin=KafkaQuotaAdmin(broker.send), retry_interval_s=0.1)
    try:
        acts.apply(transition("overfull"))  # no reconcile follows: the worker must retry
        deadline = time.monotonic() + 10
        while not acts.converged and time.monotonic() < deadline:
            time.sleep(0.05)
        assert acts.converged
        assert broker.quotas == {USER_DEFAULT: 1024.0, CLIENT_DEFAULT: 1024.0}
        assert len(events(logs, "actuator_failed")) == 2
    finally:
        acts.close()


# ------------------------------------------------------- what apply says it engaged (issue 13)


def test_apply_names_the_actuators_it_engaged(tmp_path: Path) -> None:
    """The daemon says "producers are being blocked" only naming what acted: ``apply`` tells."""
    hook = script(tmp_path, "hook.sh", "true\n")
    acts = Actuators(make_config(tmp_path, actuators=["exec"], on_change=[str(hook)]))
    try:
        assert acts.apply(transition("overfull")) == ("exec",)
        assert acts.apply(transition("overfull_cleared", percent=50)) == ("exec",)
        alert = Transition("disk_alert", "/data", "low", 75.0, 1, level=1, previous_level=0)
        assert acts.apply(alert) == ()
        assert acts.wait_idle(20)
    finally:
        acts.close()
    (tmp_path / "none").mkdir()
    none = Actuators(make_config(tmp_path / "none"))
    try:
        assert none.apply(transition("overfull")) == ()
    finally:
        none.close()
