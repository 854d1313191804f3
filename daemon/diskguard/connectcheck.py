"""``check-config --connect``: does what the config asks of the broker actually work? (edge)

Validation alone passes a config whose broker is unreachable, or whose broker frees space too
late for the disk's write rate. This asks the broker what each configured feature needs and
says, one line each, what holds and what does not; the command exits 2 when a configured
feature cannot work. It never changes anything on the broker.
"""

from __future__ import annotations

from dataclasses import dataclass

from diskguard.broker.client import BrokerClient, describe_error
from diskguard.config import Config
from diskguard.host import fsusage
from diskguard.kafkalog.serverprops import local_broker_id
from diskguard.retention.ceilings import Ceilings
from diskguard.retention.daemonstate import daemon_memory
from diskguard.retention.reclaimwatch import reclaim_settings
from diskguard.units import format_bytes, plural

__all__ = ["Check", "connect_checks"]


@dataclass(frozen=True)
class Check:
    ok: bool
    line: str


def connect_checks(config: Config, timeout: float = 5.0) -> list[Check]:
    """Every check, in order; the first failing one that makes the rest moot stops early."""
    servers = config.broker.bootstrap_servers
    if not servers:
        return [Check(False, "broker.bootstrap_servers is not set: nothing to connect to")]
    client = BrokerClient(servers, dict(config.broker.client), timeout=timeout)
    try:
        return _checks(config, client, servers)
    finally:
        client.close()


def _checks(config: Config, client: BrokerClient, servers: str) -> list[Check]:
    out: list[Check] = []
    try:
        metadata = client.metadata()
    except Exception as exc:
        return [Check(False, f"broker {servers}: not reachable: {describe_error(exc)}")]
    broker_id = local_broker_id(config.broker.log_dirs)
    ids = sorted(getattr(metadata, "brokers", {}) or {})
    here = (
        f"broker id {broker_id} (meta.properties)" if broker_id is not None else "broker id unknown"
    )
    if broker_id is not None and broker_id not in ids:
        out.append(
            Check(
                False,
                f"broker {servers}: reachable, but {here} is not in the cluster (brokers {ids}):"
                " bootstrap_servers points at another cluster?",
            )
        )
    else:
        out.append(
            Check(True, f"broker {servers}: reachable, {here}, {plural(len(ids), 'broker')}")
        )
    values = client.broker_configs(broker_id)
    settings = reclaim_settings(config, lambda: values)
    if values is None:
        out.append(
            Check(
                False,
                "DescribeConfigs on the broker failed: reclaim latency and topic cleanup "
                "policies cannot be learned from it (see the log line above)",
            )
        )
    out.append(
        Check(
            True,
            f"broker reclaim latency: retention check every {settings.check_interval_s:g} s + "
            f"delete delay {settings.delete_delay_s:g} s = up to {settings.worst_latency_s:g} s "
            f"({settings.source})",
        )
    )
    taken_over = daemon_memory(config)
    if taken_over.problem:
        out.append(Check(True, f"daemon state not used: {taken_over.problem}"))
    rates = taken_over.rates
    ceilings = Ceilings(config)
    # One line per device, labelled as the daemon labels it (a bind mount is the same disk,
    # and the daemon's measured rate is keyed by that label).
    for group in fsusage.group_by_device(config.broker.log_dirs):
        mount = group.mount
        usage = fsusage.usage_of(group.paths[0], mount, group.device)
        room = ceilings.room_above_ceiling(usage)
        rate = rates.get(mount)
        if rate is None:
            out.append(
                Check(
                    True,
                    f"{mount}: {format_bytes(room)} between the ceiling and a full disk; write "
                    "rate unknown (no running daemon has measured it): at most "
                    f"{format_bytes(int(room / settings.worst_latency_s))}/s can be absorbed",
                )
            )
            continue
        needed = int(rate * settings.worst_latency_s)
        verdict = (
            "ok"
            if needed <= room
            else "broker_reclaim_slow: lower " + (settings.settings_to_change())
        )
        out.append(
            Check(
                needed <= room,
                f"{mount}: growing {format_bytes(int(rate))}/s needs {format_bytes(needed)} of "
                f"headroom, {format_bytes(room)} between the ceiling and a full disk: {verdict}",
            )
        )
    if "acl" in config.flow_control.actuators:
        out.append(_acl_check(client, values))
    if "quota" in config.flow_control.actuators:
        out.append(
            Check(
                True,
                "quota actuator: AlterClientQuotas needs Kafka 2.6+; not checked (it would change "
                "a quota): an older broker's refusal is logged as actuator_failed",
            )
        )
    return out


def _acl_check(client: BrokerClient, broker_values: dict[str, str | None] | None) -> Check:
    """DENY ACLs act only where the broker has an authorizer: its ``authorizer.class.name``
    says so (a broker without one answers DescribeAcls with an empty list, not an error)."""
    authorizer = (broker_values or {}).get("authorizer.class.name")
    if broker_values is not None and not authorizer:
        return Check(
            False,
            "acl actuator: the broker has no authorizer (authorizer.class.name is empty): "
            "DENY WRITE ACLs would not stop any producer",
        )
    error = client.acl_error()
    if error is not None:
        return Check(False, f"acl actuator: DescribeAcls failed: {error}")
    return Check(
        True, f"acl actuator: authorizer {authorizer or '(unknown)'}, DescribeAcls answers"
    )
