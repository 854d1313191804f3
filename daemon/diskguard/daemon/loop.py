"""``diskguard run``: the daemon loop.

One thread decides; everything else only wakes it (``wakeup``: a pipe, no lock, so signal
handlers may too). inotify events are *hints* that wake it early (an overflow says all may
have changed); the retention cycle runs beside it (``cycles``) and wakes it when done. Each
iteration reads usage (one ``statvfs`` per filesystem), steps flow control at once, and asks
``schedule.tick`` what else to do (a cycle or a snapshot, reload, ``state.json``, the
watchdog), carried out through the components that own their state:

- ``flowcontrol.FlowControl``: the flow states, actuators and ballast;
- ``cycles.Retention``: the retention cycle, its worker thread and what it leaves behind;
- ``forecast.BrokerForecast``: the broker-mode look-ahead and the reclaim view;
- ``snapshot.Snapshots``: the usage snapshots' spool and Kafka sink;
- ``watch.Watcher`` (inotify hints), ``brokerprobe.BrokerProbe`` (is the broker back?).

All timers use the monotonic clock, so wall-clock jumps never stall or rush the loop. A stop
waits ``STOP_BUDGET_S`` at most: a cycle still waiting on the broker then is abandoned (the
audit log and the offline journal survive that, as they survive ``kill -9``).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from diskguard.config import Config, load_config
from diskguard.daemon.brokerprobe import BrokerProbe
from diskguard.daemon.cycles import Retention
from diskguard.daemon.filesystems import Filesystems
from diskguard.daemon.flowcontrol import FlowControl
from diskguard.daemon.forecast import BrokerForecast
from diskguard.daemon.schedule import Action, Schedule, Seen, Settings, pace_s, tick, wait_s
from diskguard.daemon.snapshot import Snapshots
from diskguard.daemon.statefile import status_line, write_state
from diskguard.daemon.wakeup import Wakeup
from diskguard.daemon.watch import Watcher
from diskguard.errors import ConfigError
from diskguard.flow.state import FlowState
from diskguard.host import sdnotify
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import configure_logging, get_logger
from diskguard.metrics import Metrics
from diskguard.retention.mode import BROKER

log = get_logger("diskguard.daemon")

#: The longest a stop waits, in all, for what is still under way (a cycle, the watches, the
#: actuators, the snapshot sink): well under one broker timeout.
STOP_BUDGET_S = 2.0
#: Actions carried out after the iteration's usage is published (they write what it says).
_LAST = (Action.WRITE_STATE, Action.WATCHDOG)


class Daemon:
    """The loop: wiring, signals, reload, and ``schedule.tick``'s actions carried out."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._stopping = False  # a plain flag and a byte in the pipe: no lock (``wakeup``)
        self._wake = Wakeup()
        self._reload = False
        self._hinted = False
        #: A partition dir or ``.lock`` changed since the last cycle began (as hints say).
        self._changed = True
        #: A stop left something under way (a cycle waiting on the broker, a probe).
        self.abandoned = False
        #: The snapshot cycle under way took nothing on trust (not ``HINTED_SNAPSHOT``).
        self._snapshot_checked = True
        self.metrics = Metrics(stale_after=max(60.0, 6 * config.retention.check_interval))
        self._watch = Watcher(self._on_hint)
        self._probe = BrokerProbe(
            self._probe_broker, max(1.0, config.retention.check_interval), self._wake.set
        )
        state_dir = Path(config.daemon.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.filesystems = Filesystems(config.broker.log_dirs)
        self.retention = Retention(config, self.metrics, self._probe, self._wake.set)
        runtime = self.retention.runtime
        self.forecast = BrokerForecast(runtime.ceilings, runtime.forecaster, self.metrics)
        self.flow = FlowControl(config, state_dir, self.metrics)
        self.snapshots = Snapshots(config, state_dir)
        self._watchdog_s: float | None = None
        #: The status line last sent to systemd (sent again only when it changes).
        self._status = ""
        self.schedule = Schedule.first(self._settings())

    def _settings(self) -> Settings:
        return Settings(
            check_interval_s=self.config.retention.check_interval,
            snapshot_interval_s=self.config.snapshots.interval,
            poll_s=self.config.retention.usage_poll_interval,
            watchdog_s=self._watchdog_s,
        )

    def _probe_broker(self) -> bool:
        """The background probe (``brokerprobe``): the current cycle's client, quietly."""
        broker = self.retention.runtime.broker
        return broker is not None and broker.reachable(quiet=True)

    # -- signals: they only set a flag and wake the loop (no lock: ``wakeup``) ------------
    def _on_stop(self, _signum: int, _frame: FrameType | None) -> None:
        self.request_stop()

    def _on_hup(self, _signum: int, _frame: FrameType | None) -> None:
        self._reload = True
        self._wake.set()

    def _on_hint(self) -> None:
        """An inotify hint (the watcher's thread): something under the log dirs changed."""
        self._hinted = True
        self._wake.set()

    def request_stop(self) -> None:
        self._stopping = True
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        self._watchdog_s = sdnotify.watchdog_interval()
        self.retention.recover()
        self.flow.restore(self.filesystems.mounts)
        self._start_watching()
        self._probe.start()
        try:
            while not self._stopping:
                self._iteration()
        finally:
            self._shutdown()
        return 0

    def _iteration(self) -> None:
        settings = self._settings()
        hinted = self._wait(wait_s(self.schedule, settings, time.monotonic()))
        if self._stopping:
            return
        now = time.monotonic()
        finished = self.retention.take()
        if finished:
            self._took_cycle(now)
        usages = self.filesystems.usage()
        forecaster = self.retention.runtime.forecaster
        for mount, usage in usages.items():
            forecaster.observe_usage(mount, now, usage.used_bytes)
        self.forecast.account(usages, now)
        transitions = self.flow.step(usages, self.forecast.predicted)
        # The ladder's cordons follow the alert levels (set at the next cycle).
        self.retention.runtime.ladder.alert_levels = {
            m: s.alert_level or 0 for m, s in self.flow.states.items()
        }
        seen = self._seen(now, hinted, finished, bool(transitions), usages)
        self.schedule, actions = tick(self.schedule, settings, seen)
        # Quiet, appends and checkpoints alone wait for the (slower) usage poll.
        self._watch.lazy = self.schedule.quiet
        if transitions:
            self.flow.act(transitions, self.retention.topics_by_mount())
        for action in actions:
            if action not in _LAST:
                self._do(action)
        self.snapshots.ship()
        self._publish(usages, now)
        for action in actions:
            if action in _LAST:
                self._do(action, usages)

    def _wait(self, seconds: float) -> bool:
        """Until something wakes the loop, at most ``seconds``; whether a hint woke it."""
        self._wake.wait(seconds)
        hinted, self._hinted = self._hinted, False
        if hinted:  # a burst of hints settles first; only a stop ends that sooner
            self._wake.settle(pace_s(self.schedule, time.monotonic()), lambda: self._stopping)
        self._wake.clear()
        return hinted

    def _took_cycle(self, now: float) -> None:
        """A cycle finished and its outcome was applied: the forecast starts from its scan."""
        last = self.retention.last
        if last is None:
            return
        self.forecast.broker_mode = last.mode.mode == BROKER
        self.forecast.rebase({fs.usage.mount: fs.usage for fs in last.scan.filesystems}, now)
        for fsp in last.plan.filesystems:
            capacity = fsp.used_bytes + fsp.available_bytes
            self.flow.observe_limits(fsp.mount, fsp.device, fsp.total_bytes, capacity)

    def _seen(
        self,
        now: float,
        hinted: bool,
        finished: bool,
        transitions: bool,
        usages: Mapping[str, FilesystemUsage],
    ) -> Seen:
        """What the schedule decides on. The retention facts are read only while no cycle
        runs (it owns them meanwhile); hints are taken only then, so none is lost."""
        reload, self._reload = self._reload, False
        retention = self.retention
        facts: dict[str, bool] = {}
        if retention.idle:
            mounts = len(self.filesystems)
            hint = self._watch.take()
            self._changed = self._changed or hint.partitions or bool(hint.lock_dirs)
            over = self.forecast.over(usages, mounts)
            margins = retention.quiet_margins(usages, self._settings().quiet_poll_every_s)
            facts = {
                "unchanged": retention.unchanged(usages, hint, mounts),
                "over": over,
                # Only while every dir is watched can "no hint" mean "nothing changed".
                "quiet": self._watch.complete
                and not (self._changed or over or self.flow.engaged())
                and retention.quiet(usages, mounts, self.schedule.rescan_s, margins)
                and self.flow.well_under(usages, self.forecast.predicted, margins),
                "stuck": bool(retention.stuck.states),
                # Never backed off while some dir is not watched (``Watcher.complete``): a
                # change there sends no hint, so only the rescan sees it.
                "all_stuck": self._watch.complete
                and retention.stuck.all_stuck(retention.over_usage(usages)),
            }
        return Seen(
            now=now,
            hinted=hinted,
            reload=reload,
            finished=finished,
            transitions=transitions,
            byte_budget=retention.runtime.ceilings.byte_budget,
            cycle_cpu_s=retention.cycle_cpu_s,
            **facts,
        )

    def _do(self, action: Action, usages: Mapping[str, FilesystemUsage] | None = None) -> None:
        if action is Action.RELOAD:
            self._do_reload()
        elif action is Action.CYCLE:
            self._changed = False  # what changed from here on, the next scan sees
            self.retention.start(full=False)
        elif action in (Action.SNAPSHOT, Action.RESCAN):
            self._changed = False
            self._snapshot_checked = True
            self._watch.take_touched()  # from here on, what the next full scan re-reads
            self.retention.start(full=True)
        elif action is Action.HINTED_SNAPSHOT:
            self._changed = False
            touched = self._watch.take_touched()
            self._snapshot_checked = touched is None
            self.retention.start(full=True, trust=touched)
        elif action is Action.RECORD_SNAPSHOT:
            # Partition dirs made since the last check may be past the watch limit (the
            # reader skips them): say so, and keep the rescans at check_interval. A dir made
            # is an event, so a snapshot that took the hints' word has nothing new to verify.
            if self._snapshot_checked:
                self._watch.verify(self.config.broker.log_dirs, self.retention.log_dir_listing)
            last = self.retention.last
            if last is not None:
                self.snapshots.record(
                    last.scan,
                    self.filesystems.mounts,
                    self.flow.states,
                    self.forecast.views,
                    self.retention.deleted,
                    # The walk of /proc goes with the checks: while quiet, every rescan.
                    open_files=self._snapshot_checked,
                )
        elif action is Action.RECONCILE:
            # Topics come and go: a topic created while its disk is overfull needs its ACL.
            self.flow.reconcile(self.retention.topics_by_mount())
            self.flow.ensure_ballast(self.filesystems.usage())
        elif action is Action.ANNOUNCE_STARTED:
            self._announce_started()
        elif action is Action.WRITE_STATE:
            self._write_state(usages or {})
        elif action is Action.WATCHDOG:
            # Pinged from the loop itself: a stuck loop stops pinging and systemd restarts it.
            sdnotify.watchdog()

    def _publish(self, usages: Mapping[str, FilesystemUsage], now: float) -> None:
        """Each iteration: the reclaim view and every filesystem's metrics."""
        self.forecast.observe(usages, now)
        ceilings = self.retention.runtime.ceilings
        for mount, usage in usages.items():
            state = self.flow.states.get(mount, FlowState())
            self.metrics.observe_filesystem(
                usage,
                limit_percent=ceilings.limit_percent,
                pending_reclaim_bytes=ceilings.pending(mount),
                overfull=bool(state.overfull),
                alert_level=state.alert_level or 0,
                deleted_open_bytes=self.snapshots.deleted_open.get(mount),
            )
        self.metrics.cycle_done()

    def _write_state(self, usages: Mapping[str, FilesystemUsage]) -> None:
        write_state(
            Path(self.config.daemon.state_dir),
            self.flow.states,
            self.retention.last_deletion,
            self.retention.runtime.ceilings.pending,
            self.forecast.views,
            self.retention.set_aside,
        )
        line = status_line(usages, self.flow.states)
        if line != self._status:
            self._status = line
            sdnotify.status(line)

    def _announce_started(self) -> None:
        first = self.retention.last
        settings = self.retention.runtime.forecaster.reclaim.settings
        log.info(
            "daemon_started",
            config=str(self.config.source),
            log_dirs=[str(d) for d in self.config.broker.log_dirs],
            filesystems=sorted(self.filesystems.mounts),
            partitions=(
                sum(len(d.partitions) for fs in first.scan.filesystems for d in fs.log_dirs)
                if first
                else 0
            ),
            mode=first.mode.mode if first else "unknown",
            # What the broker-mode forecast starts from (measured values follow in status).
            reclaim_check_interval_s=settings.check_interval_s,
            reclaim_delete_delay_s=settings.delete_delay_s,
            reclaim_settings_source=settings.source,
        )
        self._ready()

    def _ready(self) -> None:
        """READY=1 with the status line (after start-up and after a reload)."""
        self._status = status_line(self.forecast.usage, self.flow.states)
        sdnotify.ready(self._status)

    def _start_watching(self) -> None:
        reclaim = self.retention.runtime.forecaster.reclaim
        self._watch.start(self.config.broker.log_dirs, reclaim.on_event)

    # -- reload (no cycle runs: the schedule waits for it) -------------------------------
    def _do_reload(self) -> None:
        sdnotify.reloading()
        source = self.config.source
        try:
            new = load_config(Path(source))
        except ConfigError as exc:
            for problem in exc.problems:
                log.error("config_reload_rejected", problem=problem, config=str(source))
            sdnotify.ready("config reload rejected; previous config stays in force")
            return
        self._watch.stop()
        self.flow.close()
        self.snapshots.close()
        self.retention.close()
        old = dict(self.filesystems.devices)
        self.config = new
        configure_logging(new.logging.format, new.logging.level)
        state_dir = Path(new.daemon.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.filesystems = Filesystems(new.broker.log_dirs)
        self.retention.build(new)
        runtime = self.retention.runtime
        self.forecast.rewire(runtime.ceilings, runtime.forecaster)
        self.flow.build(new, state_dir)
        self.snapshots.build(new, state_dir)
        self._probe.interval = max(1.0, new.retention.check_interval)
        for mount, device in old.items():
            if mount not in self.filesystems.devices:
                self.metrics.forget_filesystem(mount, device)
                self.flow.forget(mount)
                self.forecast.forget(mount)
        self._start_watching()
        log.info("config_reloaded", config=str(source))
        self._ready()

    # -- stop -------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Everything still under way gets what is left of ``STOP_BUDGET_S``, no more: a
        cycle waiting on a hung broker is abandoned, a hook still running is ended with its
        process group, the snapshot sink keeps what it did not ship in its spool."""
        deadline = time.monotonic() + STOP_BUDGET_S

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        sdnotify.stopping()
        self._watch.stop(timeout=min(1.0, left()))
        probing = self._probe.stop(timeout=min(0.5, left()))
        under_way = self.retention.stop(timeout=left())
        self.flow.close(timeout_s=left(), stopping=True)
        self.snapshots.close(timeout=left())
        if not under_way:
            self.retention.close()
        self.abandoned = under_way or probing
        log.info("daemon_stopped", cycle_under_way=under_way)


def run_daemon(config: Config) -> int:
    configure_logging(config.logging.format, config.logging.level)
    # ``kill -USR2``: every thread's stack on stderr (the journal), for a daemon that seems
    # stuck; it goes on running.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    daemon = Daemon(config)
    if config.metrics.listen:
        daemon.metrics.start(config.metrics.listen)
    try:
        code = daemon.run()
    finally:
        daemon.metrics.stop()
    if daemon.abandoned:
        # A thread still waits in the Kafka client for a broker that does not answer; the
        # interpreter's exit would tear the client down and wait for it. Everything of ours
        # is closed and said: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
