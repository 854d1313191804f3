"""A hung real Kafka broker (SIGSTOP: the kernel still accepts its connections, nothing is
answered) while ``diskguard run`` guards its disk in broker mode: an overfull crossing is
reported within the usage poll, not after the cycle's broker calls time out, and SIGTERM
ends the daemon before one broker timeout would have expired (the same fault against the
stand-in broker: tests/daemon/test_shutdown.py)."""

from __future__ import annotations

from pathlib import Path

from support.configs import write_config
from support.daemonproc import DaemonProc
from support.disks import df_percent
from support.hung import cross_then_stop, grow
from support.kafka.cluster import KafkaCluster as RealBroker


def _guarded_topic(
    real_kafka: RealBroker, tmp_path: Path, topic: str, **sections: object
) -> tuple[Path, float]:
    """A topic with closed segments on the session's broker, and a broker-mode config whose
    ceiling is 3 points above today's usage (other tests' topics never candidates)."""
    real_kafka.create_topic(topic, **real_kafka.segment_config(200_000))
    assert real_kafka.produce(topic, 1200, 500, settings={"batch.size": 50_000}) == []
    ceiling = round(df_percent(real_kafka.log_dir.parent) + 3, 2)
    config = write_config(
        tmp_path,
        real_kafka.log_dir,
        broker={"bootstrap_servers": real_kafka.bootstrap},
        assume_delete_policy=[f"^{topic}$"],
        protect_topics=[f"^(?!{topic}$)"],
        mode="broker",
        check_interval="1s",
        usage_poll_interval="0.1s",
        disk_usage_percent=ceiling,
        **sections,
    )
    return config, ceiling


def test_a_hung_real_broker_holds_up_neither_flow_control_nor_shutdown(
    real_kafka: RealBroker, tmp_path: Path
) -> None:
    mount = real_kafka.log_dir.parent
    over_ceiling, over_overfull = mount / "hung-filler-1.bin", mount / "hung-filler-2.bin"
    overfull = round(df_percent(mount) + 8, 2)
    config, ceiling = _guarded_topic(
        real_kafka,
        tmp_path,
        "hung-orders",
        flow_control={"overfull_percent": overfull, "underfull_percent": overfull - 5},
    )
    try:
        with DaemonProc(config) as daemon:
            daemon.wait_for("daemon_started", timeout=60)
            real_kafka.node.pause()
            cross_then_stop(daemon, (over_ceiling, over_overfull), ceiling, overfull)
    finally:
        real_kafka.node.resume()
        over_ceiling.unlink(missing_ok=True)
        over_overfull.unlink(missing_ok=True)


def test_a_cycle_against_a_hung_real_broker_waits_out_one_timeout(
    real_kafka: RealBroker, tmp_path: Path
) -> None:
    """The cycle's broker calls go through two clients (confluent-kafka; kafka-python for the
    log dirs) and some answer a timeout partially rather than raise: still, once one call
    waited the timeout out, every later call of the cycle fails at once, saying why. Before,
    a cycle here took four timeouts (20 s): DescribeLogDirs, then the groups' listing
    cut short, then the others."""
    filler = real_kafka.log_dir.parent / "hung-once-filler.bin"
    config, ceiling = _guarded_topic(real_kafka, tmp_path, "hung-once")
    try:
        with DaemonProc(config) as daemon:
            daemon.wait_for("daemon_started", timeout=60)
            real_kafka.node.pause()
            mark = len(daemon.events)
            grow(filler, ceiling)
            cycle = daemon.wait_for(
                "retention_cycle",
                timeout=120,
                where=lambda e: any(e is later for later in daemon.events[mark:]),
            )
            meanwhile = daemon.events[mark : daemon.events.index(cycle)]
            print(f"the cycle against the hung broker took {cycle.get('duration_ms')} ms")
            failed = [e for e in meanwhile if e.get("error")]
            waited = [e for e in failed if "earlier in this cycle" not in str(e["error"])]
            assert failed and len(waited) == 1, failed
    finally:
        real_kafka.node.resume()
        filler.unlink(missing_ok=True)
