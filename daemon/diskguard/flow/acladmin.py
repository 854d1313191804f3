"""The ACL calls of the ``acl`` actuator, each in a short-lived child process (edge).

Through confluent-kafka's ``AdminClient`` (``create_acls``, ``describe_acls``,
``delete_acls``; verified against Apache Kafka 2.2 and 4.x): librdkafka aborts the whole
process on a CreateAcls answer it cannot parse, and a guard must survive a broken broker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from diskguard.config import BrokerConfig
from diskguard.flow.actuator import ActuatorError
from diskguard.flow.holds import AclBinding

__all__ = ["AclAdmin", "ConfluentAclAdmin", "ProcessAclAdmin"]


class AclAdmin(Protocol):
    """The three ACL calls the ``acl`` actuator needs (injectable for tests)."""

    def topic_acls(self) -> set[AclBinding]:
        """Every ACL on a TOPIC resource (DescribeAcls)."""
        ...

    def create(self, bindings: Sequence[AclBinding]) -> None:
        """CreateAcls, then DescribeAcls to check the broker holds them."""
        ...

    def delete(self, bindings: Sequence[AclBinding]) -> None:
        """DeleteAcls of exactly these bindings, then DescribeAcls to see them gone."""
        ...


class ConfluentAclAdmin:
    """ACLs through confluent-kafka's ``AdminClient``: ``create_acls`` then ``describe_acls``
    to check the broker really holds them (a broker that answers CreateAcls without keeping
    the ACL would otherwise look like a success while producers go on writing), and
    ``delete_acls`` with exact filters (only the bindings asked for, never a wider match),
    then ``describe_acls`` until the broker no longer lists them (a release is complete only
    once producers may write again).

    ``admin`` is a ``confluent_kafka.admin.AdminClient`` or anything with those three
    methods and its future-returning shapes (tests inject a fake).
    """

    def __init__(self, admin: Any, timeout_s: float = 10.0) -> None:
        self._admin = admin
        self._timeout = timeout_s

    @staticmethod
    def _native(binding: AclBinding | None, exact: bool) -> Any:
        """Our binding as confluent-kafka's ``AclBinding`` (``exact``: an exact filter), or
        with ``None`` the filter for every TOPIC ACL."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, untyped
            AclBinding as NativeBinding,
        )
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        if binding is None:
            return AclBindingFilter(  # None = any name, principal, host
                ResourceType.TOPIC,
                None,  # type: ignore[arg-type]
                ResourcePatternType.ANY,
                None,  # type: ignore[arg-type]
                None,  # type: ignore[arg-type]
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
        cls: Any = AclBindingFilter if exact else NativeBinding
        return cls(
            ResourceType[binding.resource_type],
            binding.name,
            ResourcePatternType[binding.pattern_type],
            binding.principal,
            binding.host,
            AclOperation[binding.operation],
            AclPermissionType[binding.permission],
        )

    @staticmethod
    def _ours(native: Any) -> AclBinding:
        return AclBinding(
            native.restype.name,
            native.name,
            native.resource_pattern_type.name,
            native.principal,
            native.host,
            native.operation.name,
            native.permission_type.name,
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

    def topic_acls(self) -> set[AclBinding]:
        try:
            listed = self._admin.describe_acls(
                self._native(None, exact=True), request_timeout=self._timeout
            ).result(timeout=self._timeout)
        except Exception as exc:
            raise ActuatorError(f"DescribeAcls failed: {_client_error(exc)}") from None
        return {self._ours(b) for b in listed or ()}

    def create(self, bindings: Sequence[AclBinding]) -> None:
        natives = [self._native(b, exact=False) for b in bindings]
        futures = self._admin.create_acls(natives, request_timeout=self._timeout)
        self._results(futures, "CreateAcls", len(natives))
        missing = self._wait_listed(bindings, listed=True)
        if missing:
            raise ActuatorError(
                f"CreateAcls was accepted but DescribeAcls does not list {len(missing)} of "
                f"them, e.g. {missing[0]}"
            )

    def delete(self, bindings: Sequence[AclBinding]) -> None:
        filters = [self._native(b, exact=True) for b in bindings]
        futures = self._admin.delete_acls(filters, request_timeout=self._timeout)
        self._results(futures, "DeleteAcls", len(filters))
        left = self._wait_listed(bindings, listed=False)
        if left:
            raise ActuatorError(
                f"DeleteAcls was accepted but DescribeAcls still lists {len(left)} of "
                f"them, e.g. {left[0]}"
            )

    def _wait_listed(self, bindings: Sequence[AclBinding], listed: bool) -> list[AclBinding]:
        """Ask DescribeAcls until every binding is (``listed``) or is no longer listed, for
        at most the timeout; what still differs then. KRaft: the controller has the change
        when CreateAcls/DeleteAcls answers, the broker answering DescribeAcls only once it
        replayed it; a moment's lag is neither a lost ACL nor a hold still in place, and a
        release is complete only once the broker no longer lists what it lifted."""
        deadline = time.monotonic() + self._timeout
        while True:
            present = self.topic_acls()
            differ = sorted(b for b in bindings if (b in present) != listed)
            if not differ or time.monotonic() > deadline:
                return differ
            time.sleep(0.2)


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

    def topic_acls(self) -> set[AclBinding]:
        answer = self._call("list", ())
        return {AclBinding.from_json(b) for b in answer.get("acls") or ()}

    def create(self, bindings: Sequence[AclBinding]) -> None:
        self._call("create", bindings)

    def delete(self, bindings: Sequence[AclBinding]) -> None:
        self._call("delete", bindings)

    def _call(self, op: str, bindings: Sequence[AclBinding]) -> dict[str, Any]:
        if not self._broker.bootstrap_servers:
            raise ActuatorError("broker.bootstrap_servers is not set")
        what = {"create": "CreateAcls", "delete": "DeleteAcls", "list": "DescribeAcls"}[op]
        request = {
            "op": op,
            "bindings": [b.to_json() for b in bindings],
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
                    "from diskguard.flow.acladmin import _acl_child; _acl_child()",
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
            return answer
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
        bindings = [AclBinding.from_json(b) for b in request["bindings"]]
        answer: dict[str, Any] = {"ok": True}
        if request["op"] == "create":
            acl.create(bindings)
        elif request["op"] == "delete":
            acl.delete(bindings)
        else:
            answer["acls"] = [b.to_json() for b in sorted(acl.topic_acls())]
    except ActuatorError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        sys.exit(1)
    except Exception as exc:
        print(json.dumps({"error": _client_error(exc)}), flush=True)
        sys.exit(1)
    print(json.dumps(answer), flush=True)
