"""Actuators: what diskguard does about an overfull store (edge).

The pure ``flowstate.step`` says *when* a filesystem becomes overfull or clears; this module
logs that and acts on it, with three configurable actuators (``flow_control.actuators``):

``exec``
    Runs ``flow_control.on_change`` (argv, no shell) on every ``overfull`` /
    ``overfull_cleared`` with ``DISKGUARD_*`` variables, on a background thread, killed
    (whole process group) at ``on_change_timeout``. A notification: never retried.
``quota``
    Throttles producers with a Kafka client quota (``producer_byte_rate``) through
    AlterClientQuotas while any filesystem is overfull, and restores the values that were
    there before (read with DescribeClientQuotas first) when all have cleared.
``acl``
    Adds DENY WRITE ACLs (principal ``flow_control.acl_principal``, host ``*``, TOPIC
    LITERAL) for every topic with a partition on an overfull filesystem; removed on clear.

Why level-triggered: ``quota`` and ``acl`` are driven by a *desired* state (which mounts are
overfull, which topics live there) that a worker converges the broker to, recording what it
applied in ``<state_dir>/actuators.json`` *before* applying it. A daemon killed with -9 in
the middle finds that record on restart, and the first ``reconcile`` removes what is no
longer wanted — producers are never left blocked by a crashed guard. A failed call is logged
as ``actuator_failed``, counted (``failure_counts()``, for metrics), and retried on the next
``reconcile``; nothing here ever raises into the daemon loop, and nothing here blocks it:
broker calls and hooks run on worker threads.

``acl`` talks Kafka through confluent-kafka's ``AdminClient`` (``create_acls``,
``describe_acls``, ``delete_acls``; verified against Apache Kafka 2.2 with
SimpleAclAuthorizer), each call in a child process: librdkafka aborts the whole process on
a CreateAcls answer it cannot parse, and a guard must survive a broken broker. ``quota``
uses kafka-python (``KafkaAdminClient``): confluent-kafka has no client-quota API. Brokers
before Kafka 2.6 have no client-quota API either (KIP-546): ``quota`` then logs one
``actuator_failed`` per overfull episode naming the missing API and does not retry it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from diskguard.config import BrokerConfig, Config, QuotaConfig
from diskguard.flow.state import Transition
from diskguard.host.atomicfile import read_json, write_json_atomic
from diskguard.logs import get_logger

__all__ = [
    "STATE_FILE",
    "AclAdmin",
    "ActuatorError",
    "Actuators",
    "ConfluentAclAdmin",
    "HookRunner",
    "KafkaAdminConnection",
    "KafkaQuotaAdmin",
    "ProcessAclAdmin",
    "QuotaAdmin",
    "QuotaEntity",
    "quota_entities",
]

STATE_FILE: Final = "actuators.json"
PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
_STATE_VERSION: Final = 1
_OUTPUT_LIMIT: Final = 4096
_HOOK_QUEUE_MAX: Final = 64


def _log() -> Any:
    """Looked up per call: a module-level logger would keep the import-time configuration."""
    return get_logger("diskguard.actuators")


#: Who a quota applies to: sorted ``(entity_type, name)`` pairs, ``None`` = the default entity.
QuotaEntity = tuple[tuple[str, str | None], ...]


class ActuatorError(Exception):
    """A broker refused or could not do what an actuator asked; message is one line."""


def quota_entities(cfg: QuotaConfig) -> list[QuotaEntity]:
    """Configured entities, or the default user and the default client id when none are."""
    if not cfg.entities:
        return [(("user", None),), (("client-id", None),)]
    return [tuple(sorted(entity.items())) for entity in cfg.entities]


def _entity_key(entity: QuotaEntity) -> str:
    return ",".join(f"{kind}={'<default>' if name is None else name}" for kind, name in entity)


# --------------------------------------------------------------------------- broker clients


class QuotaAdmin(Protocol):
    """The two quota calls the ``quota`` actuator needs (injectable for tests)."""

    def describe_producer_byte_rate(self, entity: QuotaEntity) -> float | None:
        """The entity's own ``producer_byte_rate`` (None = not set)."""
        ...

    def alter_producer_byte_rate(self, entity: QuotaEntity, value: float | None) -> None:
        """Set the entity's ``producer_byte_rate``; None removes it."""
        ...


class AclAdmin(Protocol):
    """The two ACL calls the ``acl`` actuator needs (injectable for tests)."""

    def deny_writes(self, topics: Sequence[str], principal: str) -> None: ...

    def remove_deny_writes(self, topics: Sequence[str], principal: str) -> None: ...


def _kafka_error(code: int, message: str | None, what: str) -> ActuatorError:
    import kafka.errors as kafka_errors

    name = kafka_errors.for_code(code).__name__
    detail = f": {message}" if message else ""
    return ActuatorError(f"{what} failed: {name} (error code {code}){detail}")


class KafkaQuotaAdmin:
    """DescribeClientQuotas / AlterClientQuotas built and parsed with kafka-python's messages.

    ``send`` takes a kafka-python request object and returns its response object; the real
    one goes over ``KafkaAdminConnection``, tests pass a fake broker.
    """

    def __init__(self, send: Callable[[Any], Any]) -> None:
        self._send = send

    def describe_producer_byte_rate(self, entity: QuotaEntity) -> float | None:
        from kafka.protocol.admin import DescribeClientQuotasRequest as Describe

        components = [
            Describe.ComponentData(
                entity_type=kind, match_type=1 if name is None else 0, match=name
            )
            for kind, name in entity
        ]
        response = self._send(Describe(components=components, strict=True))
        if response.error_code:
            raise _kafka_error(response.error_code, response.error_message, "DescribeClientQuotas")
        for entry in response.entries or ():
            found = tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity))
            if found != entity:
                continue
            for value in entry.values:
                if value.key == PRODUCER_BYTE_RATE:
                    return float(value.value)
        return None

    def alter_producer_byte_rate(self, entity: QuotaEntity, value: float | None) -> None:
        from kafka.protocol.admin import AlterClientQuotasRequest as Alter

        op = Alter.EntryData.OpData(
            key=PRODUCER_BYTE_RATE,
            value=0.0 if value is None else float(value),
            remove=value is None,
        )
        request = Alter(
            entries=[
                Alter.EntryData(
                    entity=[
                        Alter.EntryData.EntityData(entity_type=kind, entity_name=name)
                        for kind, name in entity
                    ],
                    ops=[op],
                )
            ],
            validate_only=False,
        )
        response = self._send(request)
        entries = list(response.entries or ())
        if not entries:
            raise ActuatorError("AlterClientQuotas failed: the broker answered with no entries")
        for entry in entries:
            if entry.error_code:
                raise _kafka_error(entry.error_code, entry.error_message, "AlterClientQuotas")


class ConfluentAclAdmin:
    """DENY WRITE on TOPIC LITERAL through confluent-kafka's ``AdminClient``:
    ``create_acls``, then ``describe_acls`` to check the broker really holds them (a broker
    that answers CreateAcls without keeping the ACL would otherwise look like a success
    while producers go on writing); ``delete_acls`` on clear.

    ``admin`` is a ``confluent_kafka.admin.AdminClient`` or anything with those three
    methods and its future-returning shapes (tests inject a fake).
    """

    def __init__(self, admin: Any, timeout_s: float = 10.0) -> None:
        self._admin = admin
        self._timeout = timeout_s

    @staticmethod
    def _pattern(topic: str | None, principal: str, binding: bool) -> Any:
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, untyped
            AclBinding,
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        cls: Any = AclBinding if binding else AclBindingFilter
        return cls(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation.WRITE,
            AclPermissionType.DENY,
        )

    def _results(self, futures: Mapping[Any, Any], what: str, total: int) -> list[Any]:
        answers: list[Any] = []
        errors: list[str] = []
        for key, future in futures.items():
            try:
                answers.append(future.result(timeout=self._timeout))
            except Exception as exc:
                errors.append(f"topic {getattr(key, 'name', key)!r}: {_client_error(exc)}")
        if errors:
            raise ActuatorError(f"{what} failed for {len(errors)} of {total} ACL(s): {errors[0]}")
        return answers

    def deny_writes(self, topics: Sequence[str], principal: str) -> None:
        bindings = [self._pattern(topic, principal, binding=True) for topic in topics]
        futures = self._admin.create_acls(bindings, request_timeout=self._timeout)
        self._results(futures, "CreateAcls", len(bindings))
        listed = self._admin.describe_acls(
            self._pattern(None, principal, binding=False), request_timeout=self._timeout
        ).result(timeout=self._timeout)
        missing = sorted(set(topics) - {b.name for b in listed or ()})
        if missing:
            raise ActuatorError(
                f"CreateAcls was accepted but DescribeAcls does not list DENY WRITE for "
                f"{principal} on {len(missing)} topic(s), e.g. {missing[0]!r}"
            )

    def remove_deny_writes(self, topics: Sequence[str], principal: str) -> None:
        filters = [self._pattern(topic, principal, binding=False) for topic in topics]
        futures = self._admin.delete_acls(filters, request_timeout=self._timeout)
        self._results(futures, "DeleteAcls", len(filters))


def _client_error(exc: BaseException) -> str:
    """One line for a confluent-kafka failure: Kafka's error name and its text."""
    err = exc.args[0] if exc.args else None
    name = getattr(err, "name", None)
    text = getattr(err, "str", None)
    if callable(name) and callable(text):
        return f"{name()}: {text()}"
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the broker's answer"
    return f"{type(exc).__name__}: {exc}"


class ProcessAclAdmin:
    """Runs each ACL call in a short-lived child process (``python -c`` of ``_acl_child``).

    Why: librdkafka *aborts the process* (a failed C assertion in
    ``rd_kafka_admin_response_parse``) when a broker answers CreateAcls with a response it
    cannot parse — tansu does. A guard must survive a broken broker, so the call that can
    take the process down runs where only it goes down; the daemon gets one
    ``ActuatorError`` naming what happened. A flow-control transition is rare, so the
    child's start-up cost (~0.5 s) is irrelevant.
    """

    def __init__(self, broker: BrokerConfig, timeout_s: float = 10.0) -> None:
        self._broker = broker
        self._timeout = timeout_s

    def deny_writes(self, topics: Sequence[str], principal: str) -> None:
        self._call("deny", topics, principal)

    def remove_deny_writes(self, topics: Sequence[str], principal: str) -> None:
        self._call("remove", topics, principal)

    def _call(self, op: str, topics: Sequence[str], principal: str) -> None:
        if not self._broker.bootstrap_servers:
            raise ActuatorError("broker.bootstrap_servers is not set")
        what = "CreateAcls" if op == "deny" else "DeleteAcls"
        request = {
            "op": op,
            "topics": list(topics),
            "principal": principal,
            "timeout_s": self._timeout,
            # Passed on stdin, not argv: it may hold SASL secrets.
            "config": {
                **dict(self._broker.client),
                "bootstrap.servers": self._broker.bootstrap_servers,
                "client.id": "diskguard-acl",
            },
        }
        package_parent = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_parent, env.get("PYTHONPATH", "")) if p
        )
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from diskguard.flow.actuators import _acl_child; _acl_child()",
                ],
                input=json.dumps(request),
                capture_output=True,
                text=True,
                timeout=3 * self._timeout + 15,
                env=env,
            )
        except subprocess.TimeoutExpired:
            raise ActuatorError(f"{what}: the ACL client process did not finish in time") from None
        except OSError as exc:
            raise ActuatorError(f"{what}: cannot start the ACL client process: {exc}") from None
        answer: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            lines = proc.stdout.strip().splitlines()
            answer = json.loads(lines[-1]) if lines else {}
        if proc.returncode == 0 and answer.get("ok") is True:
            return
        if isinstance(answer.get("error"), str):
            raise ActuatorError(answer["error"])
        last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "")
        if proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            raise ActuatorError(
                f"{what}: the Kafka client aborted ({name}) on the broker's answer: "
                f"{last.strip()[:300]}"
            )
        raise ActuatorError(f"{what}: ACL client exited {proc.returncode}: {last.strip()[:300]}")


def _acl_child() -> None:
    """Body of the :class:`ProcessAclAdmin` child: one request on stdin, one JSON line out."""
    request = json.loads(sys.stdin.read())
    try:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"log_level": 0, **request["config"]})
        acl = ConfluentAclAdmin(admin, float(request["timeout_s"]))
        if request["op"] == "deny":
            acl.deny_writes(request["topics"], request["principal"])
        else:
            acl.remove_deny_writes(request["topics"], request["principal"])
    except ActuatorError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        sys.exit(1)
    except Exception as exc:
        print(json.dumps({"error": _client_error(exc)}), flush=True)
        sys.exit(1)
    print(json.dumps({"ok": True}), flush=True)


#: librdkafka-style keys (what ``[broker.client]`` holds for confluent-kafka) -> kafka-python.
_CLIENT_KEYS: Final = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "client.id": "client_id",
}


class KafkaAdminConnection:
    """One lazily connected kafka-python admin client, dropped after any failure.

    Connecting lazily keeps a daemon with no reachable broker starting (and its actuators
    failing loudly, then retrying); dropping the client after a failure means the retry
    reconnects rather than reusing a connection in an unknown state.
    """

    def __init__(self, broker: BrokerConfig, timeout_s: float = 10.0) -> None:
        self._broker = broker
        self._timeout_ms = int(timeout_s * 1000)
        self._admin: Any = None
        self._lock = threading.Lock()

    def admin(self) -> Any:
        with self._lock:
            if self._admin is None:
                if not self._broker.bootstrap_servers:
                    raise ActuatorError("broker.bootstrap_servers is not set")
                from kafka.admin import KafkaAdminClient

                options: dict[str, Any] = {
                    "bootstrap_servers": self._broker.bootstrap_servers,
                    "client_id": "diskguard",
                    "request_timeout_ms": self._timeout_ms,
                    "bootstrap_timeout_ms": self._timeout_ms,
                }
                for key, value in self._broker.client.items():
                    if key in _CLIENT_KEYS:
                        options[_CLIENT_KEYS[key]] = value
                self._admin = KafkaAdminClient(**options)
            return self._admin

    def send(self, request: Any) -> Any:
        """Send one kafka-python request to the least loaded broker; its response."""
        admin = self.admin()
        # The same call kafka-python's own admin mixins make (kafka/admin/_acls.py).
        return admin._manager.run(admin._manager.send, request)

    def reset(self) -> None:
        with self._lock:
            admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    def quota_admin(self) -> QuotaAdmin:
        return KafkaQuotaAdmin(self.send)

    def acl_admin(self) -> AclAdmin:
        return ProcessAclAdmin(self._broker, self._timeout_ms / 1000)


def _missing_quota_api(exc: BaseException) -> str | None:
    """The ``actuator_failed`` text when ``exc`` says the broker lacks the quota API, else None.

    kafka-python raises ``IncompatibleBrokerVersion`` (an ``UnsupportedVersionError``) before
    sending when the broker's ApiVersions answer does not list the request; a broker that
    lists it but rejects our version answers UNSUPPORTED_VERSION (error code 35).
    """
    try:
        from kafka.errors import UnsupportedVersionError
    except ImportError:  # pragma: no cover - kafka-python is a dependency
        return None
    if not isinstance(exc, UnsupportedVersionError) and "UnsupportedVersion" not in str(exc):
        return None
    return (
        "DescribeClientQuotas/AlterClientQuotas not supported by the broker (client quotas "
        "API, Kafka 2.6+, KIP-546): producers are NOT throttled; use the acl or exec actuator "
        f"({type(exc).__name__})"
    )


# --------------------------------------------------------------------------- exec hook


def _tail(data: bytes | None) -> str:
    if not data:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= _OUTPUT_LIMIT else "…" + text[-_OUTPUT_LIMIT:]


class HookRunner:
    """Runs the ``on_change`` hook on one background thread, in event order.

    One thread (not one per event) keeps ``overfull`` / ``overfull_cleared`` hooks in the
    order they happened; the timeout bounds how long a hung hook can delay the next one,
    and the daemon loop never waits for either.
    """

    def __init__(
        self,
        argv: Sequence[str],
        timeout_s: float,
        on_failure: Callable[[str, str, str], None],
    ) -> None:
        self._argv = list(argv)
        self._timeout = timeout_s
        self._on_failure = on_failure
        self._queue: queue.Queue[dict[str, str] | None] = queue.Queue(maxsize=_HOOK_QUEUE_MAX)
        self._thread = threading.Thread(target=self._work, name="diskguard-hook", daemon=True)
        self._thread.start()

    def submit(self, env: Mapping[str, str]) -> None:
        try:
            self._queue.put_nowait(dict(env))
        except queue.Full:
            self._on_failure("exec", env.get("DISKGUARD_EVENT", "?"), "hook queue full, dropped")

    def wait_idle(self, timeout_s: float) -> bool:
        """True once every submitted hook has finished (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)

    def _work(self) -> None:
        while True:
            env = self._queue.get()
            try:
                if env is None:
                    return
                self._run(env)
            except Exception as exc:  # a hook must never kill the thread
                self._on_failure("exec", env.get("DISKGUARD_EVENT", "?") if env else "?", repr(exc))
            finally:
                self._queue.task_done()

    def _run(self, extra_env: dict[str, str]) -> None:
        event = extra_env.get("DISKGUARD_EVENT", "?")
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                self._argv,
                env={**os.environ, **extra_env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills children too
            )
        except OSError as exc:
            self._on_failure("exec", event, f"cannot run {self._argv[0]}: {exc.strerror or exc}")
            return
        timed_out = False
        try:
            out, err = proc.communicate(timeout=self._timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                # A grandchild escaped the group and holds the pipes; stop reading them.
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
                proc.wait(timeout=5)
                out, err = b"", b""
        fields = {
            "actuator": "exec",
            "hook_event": event,
            "mount": extra_env.get("DISKGUARD_MOUNT"),
            "argv": self._argv,
            "exit_code": proc.returncode,
            "duration_s": round(time.monotonic() - started, 3),
            "stdout": _tail(out),
            "stderr": _tail(err),
        }
        if timed_out:
            _log().warning("hook_finished", timed_out=True, **fields)
            self._on_failure("exec", event, f"hook killed after {self._timeout:g}s timeout")
        elif proc.returncode != 0:
            _log().warning("hook_finished", timed_out=False, **fields)
            self._on_failure("exec", event, f"hook exited with code {proc.returncode}")
        else:
            _log().info("hook_finished", timed_out=False, **fields)


# --------------------------------------------------------------------------- actuators


@dataclass
class _Applied:
    """What is applied on the broker right now, as persisted in ``actuators.json``."""

    #: Mounts known to be overfull, with the topics that have partitions there (desired).
    overfull: dict[str, list[str]] = field(default_factory=dict)
    #: Quota entities we changed -> their value before (None = had none). Non-empty = throttled.
    quota_previous: dict[str, tuple[QuotaEntity, float | None]] = field(default_factory=dict)
    quota_applied: bool = False
    #: (topic, principal) pairs with our DENY WRITE ACL.
    acl: set[tuple[str, str]] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "overfull": {m: sorted(t) for m, t in sorted(self.overfull.items())},
            "quota": {
                "applied": self.quota_applied,
                "previous": [
                    {"entity": [list(p) for p in entity], "value": value}
                    for _key, (entity, value) in sorted(self.quota_previous.items())
                ],
            },
            "acl": [{"topic": t, "principal": p} for t, p in sorted(self.acl)],
        }

    @classmethod
    def from_json(cls, data: Any) -> _Applied:
        if not isinstance(data, dict) or data.get("version") != _STATE_VERSION:
            return cls()
        previous: dict[str, tuple[QuotaEntity, float | None]] = {}
        quota = data.get("quota") or {}
        for item in quota.get("previous") or ():
            entity: QuotaEntity = tuple(
                (str(k), None if n is None else str(n)) for k, n in item["entity"]
            )
            value = item.get("value")
            previous[_entity_key(entity)] = (entity, None if value is None else float(value))
        return cls(
            overfull={
                str(m): [str(t) for t in ts] for m, ts in (data.get("overfull") or {}).items()
            },
            quota_previous=previous,
            quota_applied=bool(quota.get("applied")),
            acl={(str(a["topic"]), str(a["principal"])) for a in data.get("acl") or ()},
        )


class Actuators:
    """Logs flow-control transitions and drives the configured actuators.

    Call ``apply(transition, topics)`` for every transition ``flowstate.step`` returns and
    ``reconcile(overfull_by_mount, topics_by_mount)`` once per cycle with every filesystem's
    current state: ``apply`` fires the hook and updates the wish at once; ``reconcile`` is
    what makes a restarted daemon (or a changed topic list) converge. Neither blocks nor
    raises. A failed broker call is retried by the worker every ``retry_interval_s`` until
    it succeeds (and on every ``apply``/``reconcile``). ``background=False`` runs broker calls
    in the caller's thread (CLI, tests) and retries only on the next call.
    """

    def __init__(
        self,
        cfg: Config,
        state_dir: Path | None = None,
        *,
        on_failure: Callable[[str], None] | None = None,
        quota_admin: QuotaAdmin | None = None,
        acl_admin: AclAdmin | None = None,
        background: bool = True,
        broker_timeout_s: float = 10.0,
        retry_interval_s: float = 10.0,
    ) -> None:
        flow = cfg.flow_control
        self._kinds = set(flow.actuators)
        self._quota_cfg = flow.quota
        self._principal = flow.acl_principal
        self._state_path = (state_dir or cfg.daemon.state_dir) / STATE_FILE
        self._failures: dict[str, int] = {"exec": 0, "quota": 0, "acl": 0}
        self._failures_lock = threading.Lock()
        self._on_failure = on_failure
        self._applied = self._load()
        # A throttle or ACL recorded by an earlier run must be undone even if its actuator
        # has since been removed from the config: connect for it too.
        need_quota = (
            "quota" in self._kinds
            or self._applied.quota_applied
            or bool(self._applied.quota_previous)
        )
        need_acl = "acl" in self._kinds or bool(self._applied.acl)
        self._connection: KafkaAdminConnection | None = None
        if quota_admin is None and need_quota:
            self._connection = KafkaAdminConnection(cfg.broker, broker_timeout_s)
        self._quota_admin = quota_admin or (
            self._connection.quota_admin() if self._connection else None
        )
        if acl_admin is None and need_acl:
            acl_admin = ProcessAclAdmin(cfg.broker, broker_timeout_s)
        self._acl_admin = acl_admin
        #: The broker has no client-quota API (Kafka < 2.6): said once per overfull episode.
        self._quota_unsupported = False
        self._hooks: HookRunner | None = None
        if "exec" in self._kinds and flow.on_change:
            self._hooks = HookRunner(flow.on_change, flow.on_change_timeout, self._failed)
        self._lock = threading.Lock()  # guards _applied and the desired state
        self._sync_lock = threading.Lock()  # one converge pass at a time
        #: Bumped on every change of the desired state; a pass only counts as converged if
        #: nothing changed while it ran.
        self._generation = 0
        self._converged_generation = -1
        self._background = background
        self._retry_interval = retry_interval_s
        self._failed_passes = 0
        self._wake = threading.Condition()
        self._pending = False
        self._running = False
        self._closed = False
        self._worker: threading.Thread | None = None
        if background:
            self._worker = threading.Thread(
                target=self._work, name="diskguard-actuators", daemon=True
            )
            self._worker.start()

    # ----------------------------------------------------------------- public surface

    def apply(self, transition: Transition, topics: Iterable[str] = ()) -> tuple[str, ...]:
        """Act on one transition; ``topics`` = topics with partitions on its mount.

        Returns the actuators engaged for it (sorted; empty for a ``disk_alert`` or when none
        is configured), so the daemon names what holds producers back instead of claiming it
        (their outcome follows: ``hook_finished``, ``quota_applied``, ``acl_applied`` or
        ``actuator_failed``). The daemon logs the transition itself; this only acts.
        """
        engaged: list[str] = []
        try:
            if transition.event not in ("overfull", "overfull_cleared"):
                return ()
            if self._hooks is not None:
                self._hooks.submit(
                    {
                        "DISKGUARD_EVENT": transition.event,
                        "DISKGUARD_MOUNT": transition.mount,
                        "DISKGUARD_USAGE_PERCENT": f"{transition.usage_percent:.2f}",
                        "DISKGUARD_FREE_BYTES": str(transition.free_bytes),
                        "DISKGUARD_LIMIT": transition.limit or "",
                    }
                )
                engaged.append("exec")
            with self._lock:
                if transition.event == "overfull":
                    self._quota_unsupported = False  # a new episode: try (and say) again
                    wanted = sorted(set(topics))
                    # No topic list (no scan yet) must not drop ACLs recorded before a restart.
                    if wanted or transition.mount not in self._applied.overfull:
                        self._applied.overfull[transition.mount] = wanted
                else:
                    self._applied.overfull.pop(transition.mount, None)
                self._generation += 1
            self._request_sync()
            engaged += [k for k in ("acl", "quota") if k in self._kinds]
        except Exception as exc:  # never into the loop
            self._failed("actuators", transition.event, repr(exc))
        return tuple(sorted(engaged))

    def reconcile(
        self,
        overfull_by_mount: Mapping[str, bool | None],
        topics_by_mount: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """Make the desired state exactly the daemon's current view, then converge.

        Mounts absent from ``overfull_by_mount`` are no longer watched and count as clear;
        ``None`` (not observed yet) keeps what was recorded before. Cheap when nothing
        changed and the last pass succeeded, so call it every cycle: that is the retry.
        """
        try:
            topics_by_mount = topics_by_mount or {}
            with self._lock:
                desired: dict[str, list[str]] = {}
                for mount, overfull in overfull_by_mount.items():
                    if overfull is None:
                        if mount in self._applied.overfull:
                            desired[mount] = self._applied.overfull[mount]
                    elif overfull:
                        known = topics_by_mount.get(mount)
                        desired[mount] = sorted(
                            set(known)
                            if known is not None
                            else self._applied.overfull.get(mount, [])
                        )
                if desired != self._applied.overfull:
                    self._applied.overfull = desired
                    self._generation += 1
                needed = self._converged_generation != self._generation
            if needed:
                self._request_sync()
        except Exception as exc:  # never into the loop
            self._failed("actuators", "reconcile", repr(exc))

    def sync(self) -> bool:
        """One converge pass in the caller's thread; True when the broker matches the wish."""
        with self._sync_lock:
            with self._lock:
                generation = self._generation
                confirmed = self._converged_generation == generation
            ok = self._sync_quota(confirmed)
            ok = self._sync_acl(confirmed) and ok
            with self._lock:
                self._failed_passes = 0 if ok else self._failed_passes + 1
                if ok:
                    self._converged_generation = generation
                return ok and generation == self._generation

    def recorded_overfull_mounts(self) -> set[str]:
        """Mounts the last run recorded as overfull (from ``actuators.json`` at start-up).

        A daemon may seed ``FlowState(overfull=True)`` for these, so a restart while the
        disk sits *between* the limits continues the episode instead of releasing producers.
        """
        with self._lock:
            return set(self._applied.overfull)

    def failure_counts(self) -> dict[str, int]:
        """Failures per actuator since start (for the metrics endpoint)."""
        with self._failures_lock:
            return dict(self._failures)

    def applied(self) -> dict[str, Any]:
        """What is applied now, in the persisted JSON shape (for status output)."""
        with self._lock:
            return self._applied.to_json()

    @property
    def converged(self) -> bool:
        """The broker matches the desired state as of the last successful pass."""
        with self._lock:
            return self._converged_generation == self._generation

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait for queued broker work and hooks to finish (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            while self._pending or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
        if self._hooks is not None:
            return self._hooks.wait_idle(max(0.0, deadline - time.monotonic()))
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the workers; an in-flight broker call gets ``timeout_s`` to finish."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout_s)
        if self._hooks is not None:
            self._hooks.close()
        if self._connection is not None:
            self._connection.reset()

    # ----------------------------------------------------------------- internals

    def _failed(self, actuator: str, action: str, error: str) -> None:
        with self._failures_lock:
            self._failures[actuator] = self._failures.get(actuator, 0) + 1
            count = self._failures[actuator]
        _log().error(
            "actuator_failed", actuator=actuator, action=action, error=error, failures=count
        )
        if self._on_failure is not None:
            with contextlib.suppress(Exception):
                self._on_failure(actuator)

    def _load(self) -> _Applied:
        try:
            return _Applied.from_json(read_json(self._state_path, None))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _log().error("actuator_state_unreadable", path=str(self._state_path), error=repr(exc))
            return _Applied()

    def _save(self) -> None:
        """Persist before acting, so a crash can only leave *recorded* actions behind."""
        with self._lock:
            data = self._applied.to_json()
        self._state_path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self._state_path, data)

    def _request_sync(self) -> None:
        if not self._background:
            self.sync()
            return
        with self._wake:
            self._pending = True
            self._wake.notify_all()

    def _work(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    if not self.converged and not self._wake.wait(self._retry_delay()):
                        self._pending = True  # retry the failed pass
                        break
                    if self.converged:
                        self._wake.wait()
                if self._closed:
                    return
                self._pending = False
                self._running = True
            try:
                self.sync()
            except Exception as exc:  # the worker must survive anything
                self._failed("actuators", "sync", repr(exc))
            finally:
                with self._wake:
                    self._running = False
                    self._wake.notify_all()

    def _retry_delay(self) -> float:
        """Doubling after each failed pass, capped at 5 minutes: a broker that is down for
        an hour gets a dozen ``actuator_failed`` lines, not hundreds."""
        with self._lock:
            streak = self._failed_passes
        return min(300.0, self._retry_interval * float(2 ** max(0, min(streak - 1, 10))))

    def _broker_failed(self, actuator: str, action: str, exc: BaseException) -> None:
        if self._connection is not None:
            self._connection.reset()
        message = str(exc) if isinstance(exc, ActuatorError) else f"{type(exc).__name__}: {exc}"
        self._failed(actuator, action, message)

    def _sync_quota(self, confirmed: bool) -> bool:
        """Throttle while anything is overfull, restore when nothing is.

        Unconfirmed (after a restart or a failure) the throttle is re-sent: AlterClientQuotas
        is idempotent, and a write-ahead record may stand for a call that never reached
        the broker.
        """
        with self._lock:
            want = "quota" in self._kinds and bool(self._applied.overfull)
            have = self._applied.quota_applied or bool(self._applied.quota_previous)
        if not want and not have:
            return True
        if want and have and confirmed:
            return True
        if want and not have and self._quota_unsupported:
            return True  # already said this episode; retrying cannot help
        admin = self._quota_admin
        if admin is None:
            if have:
                # Throttle recorded by an earlier run whose config had ``quota``; we have no
                # admin now, so say so loudly rather than silently leaving it in place.
                self._failed("quota", "restore", "quota throttle recorded but actuator not set up")
                return False
            return True
        rate = float(self._quota_cfg.producer_byte_rate)
        try:
            if want:
                for entity in quota_entities(self._quota_cfg):
                    key = _entity_key(entity)
                    with self._lock:
                        known = self._applied.quota_previous.get(key)
                    if known is None:
                        previous = admin.describe_producer_byte_rate(entity)
                        with self._lock:
                            self._applied.quota_previous[key] = (entity, previous)
                            self._applied.quota_applied = True
                        self._save()  # before the alter: the restore value must survive a crash
                    else:
                        previous = known[1]
                    # Never loosen a quota that was already stricter than ours.
                    value = rate if previous is None else min(rate, previous)
                    admin.alter_producer_byte_rate(entity, value)
                    _log().info(
                        "quota_applied",
                        actuator="quota",
                        entity=key,
                        producer_byte_rate=value,
                        previous=previous,
                    )
                with self._lock:
                    self._applied.quota_applied = True
                self._save()
            else:
                with self._lock:
                    items = list(self._applied.quota_previous.items())
                for key, (entity, previous) in items:
                    admin.alter_producer_byte_rate(entity, previous)
                    _log().info(
                        "quota_restored", actuator="quota", entity=key, producer_byte_rate=previous
                    )
                    with self._lock:
                        self._applied.quota_previous.pop(key, None)
                    self._save()
                with self._lock:
                    self._applied.quota_applied = False
                self._save()
            return True
        except Exception as exc:  # logged, counted, retried next cycle
            missing = _missing_quota_api(exc)
            with self._lock:
                recorded = self._applied.quota_applied or bool(self._applied.quota_previous)
            if missing is not None and want and not recorded:
                # Nothing was applied, nothing to restore, and no retry will make the broker
                # grow the API: one line, one count, and the daemon goes on.
                self._quota_unsupported = True
                self._failed("quota", "throttle", missing)
                return True
            self._broker_failed("quota", "throttle" if want else "restore", exc)
            return False

    def _sync_acl(self, confirmed: bool) -> bool:
        with self._lock:
            if "acl" in self._kinds:
                want = {
                    (topic, self._principal)
                    for topics in self._applied.overfull.values()
                    for topic in topics
                }
            else:
                want = set()
            have = set(self._applied.acl)
        add = sorted(want - have)
        remove = sorted(have - want)
        # A recorded ACL whose create may have failed is re-sent until a pass succeeds.
        resend = sorted(want & have) if not confirmed else []
        if not add and not remove and not resend:
            return True
        admin = self._acl_admin
        if admin is None:
            self._failed("acl", "remove", "ACLs recorded but actuator not set up")
            return False
        ok = True
        by_principal: dict[str, list[str]] = {}
        for topic, principal in remove:
            by_principal.setdefault(principal, []).append(topic)
        for principal, topics in sorted(by_principal.items()):
            try:
                admin.remove_deny_writes(topics, principal)
            except Exception as exc:
                self._broker_failed("acl", "remove", exc)
                ok = False
                continue
            with self._lock:
                self._applied.acl.difference_update((t, principal) for t in topics)
            self._save()
            _log().info("acl_removed", actuator="acl", principal=principal, topics=topics)
        to_create = add + resend
        if to_create:
            with self._lock:
                self._applied.acl.update(to_create)
            self._save()  # before the create: an ACL we do not know about is one we never remove
            topics = [topic for topic, _ in to_create]
            try:
                admin.deny_writes(topics, self._principal)
            except Exception as exc:
                self._broker_failed("acl", "deny", exc)
                return False
            _log().info("acl_applied", actuator="acl", principal=self._principal, topics=topics)
        return ok
