"""``check-config --connect``: does what the config asks of the broker actually work? (edge)

Validation alone passes a config whose broker is unreachable, or whose broker frees space too
late for the disk's write rate. This asks the broker what each configured feature needs and
says, one line each, what holds and what does not; the command exits 2 when a configured
feature cannot work. It never changes anything on the broker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from diskguard.broker.authz import client_principal
from diskguard.broker.client import BrokerClient, describe_error
from diskguard.config import Config
from diskguard.flow.kafkaacl import default_allow
from diskguard.host import fsusage
from diskguard.kafkalog.model import PartitionDirKind, parse_partition_dir
from diskguard.kafkalog.serverprops import local_broker_id
from diskguard.retention.ceilings import Ceilings
from diskguard.retention.daemonstate import daemon_memory
from diskguard.retention.policystore import CACHE_FILE
from diskguard.retention.reclaim import KAFKA_INITIAL_DELAY_S
from diskguard.retention.reclaimwatch import INITIAL_DELAY_KEY, reclaim_settings
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
    if values is not None:
        out.append(Check(True, _first_check_line(values, settings.delete_delay_s)))
        out.append(Check(True, _metadata_line(values, config)))
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
    kinds = set(config.flow_control.actuators)
    if kinds & {"acl", "quota"} or config.retention.mode in ("auto", "broker"):
        out.extend(_permission_checks(config, client))
    if "acl" in kinds:
        out.append(_acl_check(client, values))
        out.append(_acl_plan_check(config))
    if "quota" in kinds:
        out.append(
            Check(
                True,
                "quota actuator: AlterClientQuotas needs Kafka 2.6+; not tried (it would change "
                "a quota): an older broker's refusal is logged as actuator_failed",
            )
        )
    return out


def _first_check_line(values: Mapping[str, str | None], delete_delay_s: float) -> str:
    """When the first retention check runs after a broker (re)start: until then nothing asked
    of the broker is freed, whatever the check interval. Configurable from Kafka 3.8
    (``log.initial.task.delay.ms``); a fixed 30 s before."""
    raw = values.get(INITIAL_DELAY_KEY)
    if INITIAL_DELAY_KEY in values and raw is not None and raw.strip().lstrip("-").isdigit():
        delay_s, where = int(raw) / 1000, INITIAL_DELAY_KEY
    else:
        delay_s, where = KAFKA_INITIAL_DELAY_S, "fixed before Kafka 3.8"
    return (
        f"first retention check {delay_s:g} s after the broker starts ({where}): right after a "
        f"broker start, space asked is freed after up to {delay_s + delete_delay_s:g} s"
    )


def _metadata_line(values: Mapping[str, str | None], config: Config) -> str:
    """KRaft or ZooKeeper, and where the cluster metadata is: what an offline rescue (broker
    down, nobody to ask) can learn each topic's cleanup.policy from."""
    roles = (values.get("process.roles") or "").strip()
    if not roles:
        if (values.get("zookeeper.connect") or "").strip():
            return (
                "ZooKeeper-mode broker: offline, topic policies come only from the state dir's "
                f"cache ({CACHE_FILE}, filled while the broker runs): run diskguard beside the "
                "broker before a rescue is needed"
            )
        return "broker mode (KRaft or ZooKeeper) not reported by the broker"
    voters = (values.get("controller.quorum.voters") or "").strip()
    bootstrap = (values.get("controller.quorum.bootstrap.servers") or "").strip()
    quorum = (
        f"controller quorum {voters} ({plural(len(voters.split(',')), 'voter')})"
        if voters
        else f"controller quorum via {bootstrap or '(not reported)'}"
    )
    combined = "controller" in roles and "broker" in roles
    role_text = (
        f"process.roles {roles}: combined, a full metadata log dir stops this quorum voter too"
        if combined
        else f"process.roles {roles}"
    )
    dirs = [d.strip() for d in (values.get("log.dirs") or values.get("log.dir") or "").split(",")]
    meta_dir = (values.get("metadata.log.dir") or "").strip() or (dirs[0] if dirs else "")
    guarded = {os.path.realpath(d) for d in config.broker.log_dirs}
    if meta_dir and os.path.realpath(meta_dir) in guarded:
        where = (
            f"metadata log in {meta_dir}, a guarded log dir: offline, topic policies are read "
            "from it"
        )
        if config.broker.server_properties is None:
            where += (
                " (a topic without a cleanup.policy override needs broker.server_properties "
                "for the broker's default, or the cache)"
            )
    else:
        where = (
            f"metadata log in {meta_dir or '(not reported)'}, not a guarded log dir: offline, "
            f"topic policies come only from the state dir's cache ({CACHE_FILE})"
        )
    return f"KRaft broker ({role_text}), {quorum}, {where}"


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
    supers = ""
    if broker_values is not None and "super.users" in broker_values:
        supers = (
            "; super.users is set (the broker hides its value): no DENY ACL applies to a "
            "super user, so the producers to hold back must not be among them"
        )
    return Check(
        True,
        f"acl actuator: authorizer {authorizer or '(unknown)'}, DescribeAcls answers{supers}",
    )


def _guarded_topics(config: Config) -> list[str]:
    """The topics with a partition dir on the guarded log dirs (the broker's own ``__*`` left
    out: diskguard neither trims nor holds them)."""
    topics: set[str] = set()
    for log_dir in config.broker.log_dirs:
        try:
            names = os.listdir(log_dir)
        except OSError:
            continue
        for name in names:
            parsed = parse_partition_dir(name)
            if (
                parsed is not None
                and parsed.kind is PartitionDirKind.LIVE
                and not parsed.topic.startswith("__")
            ):
                topics.add(parsed.topic)
    return sorted(topics)


def _permission_checks(config: Config, client: BrokerClient) -> list[Check]:
    """Who diskguard is to the broker and whether it may do what it will do: DeleteRecords
    and DescribeConfigs on its disks' topics (retention), CreateAcls/DeleteAcls (ALTER on
    the cluster), AlterClientQuotas (ALTER_CONFIGS on the cluster), the holds topic."""
    out = [Check(True, f"diskguard's principal: {client_principal(config.broker.client)}")]
    topics = _guarded_topics(config)
    holds = config.flow_control.holds_topic
    found = client.authorized([*topics, holds])
    if found.error is not None and found.cluster is None and not found.topics:
        return [*out, Check(True, f"permissions not checked: {found.error}")]
    kinds = set(config.flow_control.actuators)
    wants: list[tuple[str, str, str]] = []  # (operation, on, why)
    if "acl" in kinds:
        wants += [
            ("ALTER", "cluster", "CreateAcls/DeleteAcls"),
            ("DESCRIBE", "cluster", "DescribeAcls"),
        ]
    if "quota" in kinds:
        wants += [
            ("ALTER_CONFIGS", "cluster", "AlterClientQuotas"),
            ("DESCRIBE_CONFIGS", "cluster", "DescribeClientQuotas"),
        ]
    for operation, _on, why in wants:
        may = found.cluster_may(operation)
        if may is None:
            out.append(Check(True, f"may {operation} the cluster ({why}): not answered"))
        else:
            out.append(Check(may, f"may {operation} the cluster ({why}): {'yes' if may else 'NO'}"))
    shown = {t: ops for t, ops in found.topics.items() if t != holds}
    if config.retention.mode in ("auto", "broker") and shown:
        for operation, why in (("DELETE", "DeleteRecords"), ("DESCRIBE_CONFIGS", "cleanup.policy")):
            missing = [t for t in found.topics_without(operation) if t != holds]
            verdict = (
                f"yes, on all {plural(len(shown), 'topic')} of the guarded disks"
                if not missing
                else f"NO on {plural(len(missing), 'topic')}: {', '.join(missing[:5])}"
                + (" ..." if len(missing) > 5 else "")
            )
            out.append(Check(not missing, f"may {operation} ({why}): {verdict}"))
    if kinds & {"acl", "quota"}:
        if holds in found.topics:
            lacking = [op for op in ("READ", "WRITE") if holds in found.topics_without(op)]
            out.append(
                Check(
                    not lacking,
                    f"holds topic {holds}: "
                    + (
                        "may read and write it"
                        if not lacking
                        else f"may NOT {', '.join(lacking)} it"
                    ),
                )
            )
        else:
            may = found.cluster_may("CREATE")
            out.append(
                Check(
                    may is not False,
                    f"holds topic {holds}: does not exist yet; created at the first hold "
                    + (
                        "(may CREATE: yes)"
                        if may
                        else "(may CREATE on the cluster: NO)"
                        if may is False
                        else "(CREATE not answered)"
                    ),
                )
            )
    return out


def _acl_plan_check(config: Config) -> Check:
    """What the acl actuator will do on this cluster's topics while overfull."""
    principal = config.flow_control.acl_principal
    allow = default_allow(config.broker)
    deny = f"acl actuator: while overfull, DENY WRITE for {principal} on each topic of the disk"
    if allow is None:
        return Check(
            False,
            f"{deny}; allow.everyone.if.no.acl.found unknown (set broker.server_properties): a "
            "topic with no ACL will NOT be held (a DENY alone would stop its readers and "
            "diskguard's own DeleteRecords, an ALLOW could open it)",
        )
    if allow:
        return Check(
            True,
            f"{deny}; allow.everyone.if.no.acl.found=true: a topic with no ACL also gets "
            "ALLOW ALL for User:* (readers, DescribeConfigs and DeleteRecords keep working), "
            "a topic with ACLs only the DENY; all removed when no guard needs them",
        )
    return Check(
        True,
        f"{deny}; allow.everyone.if.no.acl.found=false: the DENY only (a topic without ACLs "
        "is closed to all but super users already); removed when no guard needs it",
    )
