"""The background broker probe on its own: probes only while wanted, wakes the loop once per
answer, survives a probe that raises, stops promptly (the daemon end to end is in
test_broker_back_e2e.py)."""

from __future__ import annotations

import threading
import time

from diskguard.daemon.brokerprobe import BrokerProbe


class Answers:
    """A probe whose answers the test sets; counts the calls."""

    def __init__(self) -> None:
        self.up = False
        self.calls = 0
        self.raise_next = False

    def __call__(self) -> bool:
        self.calls += 1
        if self.raise_next:
            self.raise_next = False
            raise RuntimeError("client closed")
        return self.up


def wait_until(cond: object, timeout: float = 60.0) -> bool:
    """True as soon as ``cond()`` is; the bound only ends a test of a broken probe."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_idle_until_wanted_then_probes_every_interval_until_an_answer() -> None:
    answers, wake = Answers(), threading.Event()
    probe = BrokerProbe(answers, 0.05, wake.set)
    probe.start()
    try:
        time.sleep(0.2)
        assert answers.calls == 0 and not probe.probing  # not wanted: never asks
        probe.want(True)
        assert wait_until(lambda: answers.calls >= 3)
        assert not wake.is_set() and not probe.take_back()
        answers.up = True
        assert wait_until(wake.is_set)
        assert probe.take_back()
        assert not probe.take_back()  # each answer once
        assert not probe.probing  # an answer ends the probing until wanted again
        calls = answers.calls
        time.sleep(0.2)
        assert answers.calls == calls
    finally:
        probe.stop()


def test_not_wanted_any_more_stops_probing_and_a_raising_probe_is_a_no() -> None:
    answers, wake = Answers(), threading.Event()
    probe = BrokerProbe(answers, 0.05, wake.set)
    probe.start()
    try:
        answers.raise_next = True
        probe.want(True)
        assert wait_until(lambda: answers.calls >= 2)  # the thread lived through the raise
        assert not wake.is_set()
        probe.want(False)
        time.sleep(0.1)
        calls = answers.calls
        time.sleep(0.2)
        assert answers.calls <= calls + 1  # at most the probe under way
        assert not wake.is_set()
    finally:
        probe.stop()


def test_stop_ends_the_thread_while_waiting_or_probing() -> None:
    """Promptly: ``stop`` waits at most 10 s for the thread, a third of the interval it
    would sleep between probes, so a thread that outlives it did not wake for the stop."""
    for wanted in (False, True):
        probe = BrokerProbe(Answers(), 30.0, threading.Event().set)
        probe.start()
        probe.want(wanted)
        time.sleep(0.05)
        assert not probe.stop()
        assert not probe._thread.is_alive()


def test_while_probing_the_last_answer_is_known_without_asking() -> None:
    """The cycle takes the probe's answer instead of waiting out the client's timeout."""
    answers, wake = Answers(), threading.Event()
    probe = BrokerProbe(answers, 0.05, wake.set)
    probe.start()
    try:
        assert probe.answer() is None  # not probing: ask the broker
        probe.want(True)
        assert wait_until(lambda: answers.calls >= 1 and probe.answer() is False)
        answers.up = True
        assert wait_until(wake.is_set)
        assert probe.answer() is None  # it answered: probing is over, ask the broker again
        probe.want(True)
        probe.want(False)
        assert probe.answer() is None
    finally:
        assert not probe.stop()
