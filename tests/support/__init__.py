"""Shared test helpers: the one place tests get log dirs, configs, disks, daemons and brokers.

Import as ``from support.configs import write_config``; names starting with ``_`` are
internals, not part of this small API.

- ``cli``: ``run_cli`` (the CLI as a subprocess), ``plan_json``, ``json_events``.
- ``configs``: ``write_config``, the one writer of a diskguard TOML config.
- ``daemonproc``: ``DaemonProc``, ``diskguard run`` followed event by event (``wait_for``).
- ``disks``: ``df_percent``, ``disk_free``, ``disk_capacity``, ``ceiling_under``,
  ``fill_to``, ``over_ceiling``, ``files_under``: df's numbers and filling a disk.
- ``fsfixtures``: real loop-mounted ext4 and tmpfs, ``fill`` (the conftest fixtures use it).
- ``kafkagen``: Kafka-format log dirs, segments, indexes, record batches, ``hold_lock``.
- ``logdirs``: ``build``, a standard log dir, and ``expected_order``, its KIP-61 order.
- ``fakes``: ``AcceptingAdmin``, an admin client that accepts every DeleteRecords.
- ``fleetgen``: a generated fleet of usage snapshots with a known truth, ``write_spool``.
- ``net``: ``free_port``.
- ``crashpoints``: kill-at-every-syscall runs of ``enforce --once`` (test and bench).
- ``kafka``: a real Apache Kafka from Maven Central (KRaft or ZooKeeper mode, one broker or a
  cluster, run as nobody); ``python -m support.kafka`` is the same for bench/ and the demo.
- ``tansu``, ``standin``: a Kafka-protocol broker, and a stand-in broker that runs retention
  like Kafka (both for what a real broker cannot be made to do on cue).
- ``promserver``: a real Prometheus server; ``terminal``: run a command on a pty.
"""
