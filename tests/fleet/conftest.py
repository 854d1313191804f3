"""One SparkSession (local[2]) for every in-process Spark test of the fleet job.

A JVM keeps the log4j configuration and the class archive of the first session it starts;
sharing one session keeps what the tests check about them true, and saves a JVM start per
module (the suite's time is counted).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from diskguard.fleet.session import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = build_session("local[2]")
    yield session
    session.stop()
