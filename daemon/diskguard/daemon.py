"""``diskguard run``: the daemon loop.

One thread decides; everything else only wakes it. inotify (watchdog) events are *hints* —
the kernel queue can overflow and watchdog hides that — so three clocks drive the loop:

- a hint or the usage poll (``retention.usage_poll_interval``, one ``statvfs`` per filesystem,
  microseconds) notices a crossing within a fraction of a second and runs a cycle at once;
- the ``check_interval`` timer runs a full cycle regardless: the rescan is the truth;
- the ``snapshots.interval`` timer runs a full (stat-every-file) scan for the snapshot.

All timers use the monotonic clock, so wall-clock jumps never stall or rush the loop.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from diskguard import fsusage
from diskguard.config import Config, ConfigError, load_config
from diskguard.logs import configure_logging, get_logger
from diskguard.runtime import Runtime

log = get_logger("diskguard.daemon")


class _Hint(FileSystemEventHandler):
    """Any change under a log dir wakes the loop; what changed is found by rescanning."""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._wake.set()


@dataclass
class _Timers:
    next_full: float = 0.0
    next_snapshot: float = 0.0


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._reload = False
        self._observer: Any = None
        self.runtime = Runtime(config)

    # -- signals --------------------------------------------------------------
    def _on_stop(self, signum: int, _frame: FrameType | None) -> None:
        log.info("daemon_stopping", signal=signal.Signals(signum).name)
        self._stop.set()
        self._wake.set()

    def _on_hup(self, _signum: int, _frame: FrameType | None) -> None:
        self._reload = True
        self._wake.set()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    # -- watching -------------------------------------------------------------
    def _start_watching(self) -> None:
        observer = Observer()
        handler = _Hint(self._wake)
        for log_dir in self.config.broker.log_dirs:
            try:
                observer.schedule(handler, str(log_dir), recursive=True)
            except OSError as exc:
                log.warning("watch_failed", log_dir=str(log_dir), error=str(exc))
        observer.daemon = True
        observer.start()
        self._observer = observer

    def _stop_watching(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
            self._observer = None

    # -- reload ---------------------------------------------------------------
    def _do_reload(self) -> None:
        self._reload = False
        source = self.config.source
        try:
            new = load_config(Path(source))
        except ConfigError as exc:
            log.error("config_reload_rejected", problems=exc.problems, config=str(source))
            return
        self.runtime.close()
        self.config = new
        self.runtime = Runtime(new)
        configure_logging(new.logging.format, new.logging.level)
        self._stop_watching()
        self._start_watching()
        log.info("config_reloaded", config=str(source))

    # -- the loop -------------------------------------------------------------
    def _over_any_limit(self) -> bool:
        """The cheap check run on every wake: one statvfs per log dir."""
        limit = self.config.retention.disk_usage_percent
        for log_dir in self.config.broker.log_dirs:
            try:
                usage = fsusage.filesystem_usage(str(log_dir))
            except OSError:
                return True  # let a full cycle report it
            if usage.usage_percent > limit:
                return True
        return False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        self._recover()
        first = self.runtime.cycle(act=True, full=True)
        log.info(
            "daemon_started",
            config=str(self.config.source),
            log_dirs=[str(d) for d in self.config.broker.log_dirs],
            filesystems=[fs.mount for fs in first.plan.filesystems],
            partitions=sum(len(d.partitions) for fs in first.scan.filesystems for d in fs.log_dirs),
            mode=first.mode.mode,
        )
        self._start_watching()
        timers = _Timers()
        now = time.monotonic()
        timers.next_full = now + self.config.retention.check_interval
        poll = self.config.retention.usage_poll_interval
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                timeout = max(0.0, min(timers.next_full - now, poll))
                hinted = self._wake.wait(timeout)
                self._wake.clear()
                if self._stop.is_set():
                    break
                if self._reload:
                    self._do_reload()
                now = time.monotonic()
                full_due = now >= timers.next_full
                # Every wake (hint or poll tick) costs one statvfs per log dir; a cycle runs
                # only when a limit is crossed or the periodic rescan is due.
                needs_bytes = hinted and self.config.retention.max_bytes is not None
                if full_due or needs_bytes or self._over_any_limit():
                    self._cycle()
                    if full_due:
                        timers.next_full = time.monotonic() + self.config.retention.check_interval
        finally:
            self._stop_watching()
            self.runtime.close()
            log.info("daemon_stopped")
        return 0

    def _cycle(self) -> None:
        try:
            self.runtime.cycle(act=True, full=False)
        except Exception as exc:  # noqa: BLE001 - the loop must survive anything one cycle hits
            log.exception("cycle_failed", error=f"{type(exc).__name__}: {exc}")
            time.sleep(0.2)

    def _recover(self) -> None:
        """Finish half-done offline deletions from a previous run before anything else."""
        if self.runtime.locked_log_dirs():
            return
        try:
            done = self.runtime.offline.recover([str(d) for d in self.config.broker.log_dirs])
        except Exception as exc:  # noqa: BLE001
            log.exception("offline_recover_failed", error=str(exc))
            return
        if done:
            log.info("offline_recovered", segments=len(done))


def run_daemon(config: Config) -> int:
    configure_logging(config.logging.format, config.logging.level)
    return Daemon(config).run()
