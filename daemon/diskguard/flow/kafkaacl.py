"""The ``acl`` actuator: DENY WRITE ACLs on the topics of an overfull filesystem (edge).

Talks Kafka through confluent-kafka's ``AdminClient`` (``create_acls``, ``describe_acls``,
``delete_acls``; verified against Apache Kafka 2.2 with SimpleAclAuthorizer), each call in a
child process: librdkafka aborts the whole process on a CreateAcls answer it cannot parse,
and a guard must survive a broken broker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from diskguard.config import BrokerConfig
from diskguard.flow.actuator import ActuatorError, Ledger, actuator_log
from diskguard.flow.state import Transition

__all__ = ["AclActuator", "AclAdmin", "ConfluentAclAdmin", "ProcessAclAdmin"]


class AclAdmin(Protocol):
    """The two ACL calls the ``acl`` actuator needs (injectable for tests)."""

    def deny_writes(self, topics: Sequence[str], principal: str) -> None: ...

    def remove_deny_writes(self, topics: Sequence[str], principal: str) -> None: ...


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
        package_parent = str(Path(__file__).resolve().parents[2])  # the dir holding diskguard/
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_parent, env.get("PYTHONPATH", "")) if p
        )
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from diskguard.flow.kafkaacl import _acl_child; _acl_child()",
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


class AclActuator:
    """``acl``: DENY WRITE for every topic with a partition on an overfull filesystem.

    ``configured`` False = present only to remove ACLs an earlier run recorded (the
    actuator was since removed from the config).
    """

    name = "acl"

    def __init__(
        self, principal: str, admin: AclAdmin, ledger: Ledger, *, configured: bool
    ) -> None:
        self._principal = principal
        self._admin = admin
        self._ledger = ledger
        self._configured = configured

    def on_transition(self, transition: Transition) -> bool:
        return self._configured

    def wait_idle(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass

    def converge(self, confirmed: bool) -> bool:
        """Remove what is no longer wanted, then deny what is (re-sent until confirmed)."""
        ledger, applied = self._ledger, self._ledger.applied
        with ledger.lock:
            if self._configured:
                want = {
                    (topic, self._principal)
                    for topics in applied.overfull.values()
                    for topic in topics
                }
            else:
                want = set()
            have = set(applied.acl)
        add = sorted(want - have)
        remove = sorted(have - want)
        # A recorded ACL whose create may have failed is re-sent until a pass succeeds.
        resend = sorted(want & have) if not confirmed else []
        if not add and not remove and not resend:
            return True
        admin = self._admin
        ok = True
        by_principal: dict[str, list[str]] = {}
        for topic, principal in remove:
            by_principal.setdefault(principal, []).append(topic)
        for principal, topics in sorted(by_principal.items()):
            try:
                admin.remove_deny_writes(topics, principal)
            except Exception as exc:
                ledger.broker_failed("acl", "remove", exc)
                ok = False
                continue
            with ledger.lock:
                applied.acl.difference_update((t, principal) for t in topics)
            ledger.save()
            actuator_log().info("acl_removed", actuator="acl", principal=principal, topics=topics)
        to_create = add + resend
        if to_create:
            with ledger.lock:
                applied.acl.update(to_create)
            # Saved before the create: an ACL we do not know about is one we never remove.
            ledger.save()
            topics = [topic for topic, _ in to_create]
            try:
                admin.deny_writes(topics, self._principal)
            except Exception as exc:
                ledger.broker_failed("acl", "deny", exc)
                return False
            actuator_log().info(
                "acl_applied", actuator="acl", principal=self._principal, topics=topics
            )
        return ok
