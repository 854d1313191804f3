"""A one-shot ``plan`` and its forked worker, for tests: a worker to hand to a function, and
``diskguard plan --json`` run in a fresh interpreter counting the requests it sends its
worker (a fresh one: the test process may hold threads, Spark's, that keep a plan from
forking)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from diskguard.host.forked import Worker

#: argv[1] "one" puts the thresholds of both kinds of work out of reach; argv[2] the config;
#: argv[3], comma-separated: "walk-twice": broker mode always walks again knowing the
#: broker's facts (never ``with_facts``); "policies-after": the topics' policies are asked
#: after the scan, never before it (``_policies_soon``), as before either existed;
#: "facts-after": the leaders and the groups' offsets are asked after the walk, for the
#: chosen topics only, never before the scan (``_broker_facts_soon``).
_COUNTING_PLAN = """
import sys
from diskguard.host import forked
from diskguard.kafkalog import parallellisting
from diskguard.retention import cycle, parallelheads
made = []
real = forked.Worker.stream
def counting(self, *a, **kw):
    made.append(1)
    return real(self, *a, **kw)
forked.Worker.stream = counting
if sys.argv[1] == "one":
    parallellisting.MIN_DIRS = parallelheads.MIN_PARTITIONS = 10**9
if "walk-twice" in sys.argv[3].split(","):
    cycle.with_facts = lambda *a, **kw: None
if "policies-after" in sys.argv[3].split(","):
    cycle.RetentionCycle._policies_soon = lambda self: None
if "facts-after" in sys.argv[3].split(","):
    cycle.RetentionCycle._broker_facts_soon = lambda self: None
from diskguard.cli import cli
try:
    cli(["plan", "-c", sys.argv[2], "--json"], prog_name="diskguard")
finally:
    sys.stderr.write(f"worker requests={len(made)}\\n")
"""


@contextmanager
def forced_worker() -> Iterator[Worker]:
    """A worker forked whatever threads the test process holds (Spark's): a plan forks
    before any of its own."""
    made = Worker.start(force=True)
    assert made is not None
    try:
        yield made
    finally:
        made.close()


def counting_plan(
    config: Path,
    *prefix: str,
    thresholds: bool = True,
    walk_twice: bool = False,
    policies_after: bool = False,
    facts_after: bool = False,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``plan --json`` with ``config`` under ``prefix`` (``taskset -c 0``, say); its stderr
    ends ``worker requests=N``. ``thresholds=False``: no work is worth the worker.
    ``walk_twice``: a broker-mode plan walks again knowing the broker's facts, always.
    ``policies_after``: it asks the topics' policies after its scan (and scans again).
    ``facts_after``: it asks the leaders and the groups' offsets after its walk."""
    how = "two" if thresholds else "one"
    walks = ",".join(
        ["as-it-will"]
        + (["walk-twice"] if walk_twice else [])
        + (["policies-after"] if policies_after else [])
        + (["facts-after"] if facts_after else [])
    )
    return subprocess.run(
        [*prefix, sys.executable, "-c", _COUNTING_PLAN, how, str(config), walks],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
