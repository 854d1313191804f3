"""The planner's hot-path ``Deletion`` (its walk's ``_deletion``, and ``placed``) is the object
the dataclass constructor makes: every field set, equal, frozen. They fill the instance dict
directly to skip the generated ``__init__`` (10,000 deletions a plan); a field added to
``Deletion`` and not to them must fail here, not as an AttributeError in a plan."""

from __future__ import annotations

import dataclasses
from dataclasses import fields, replace

import pytest

from diskguard.kafkalog.model import FilesystemUsage, Partition, SegmentInfo
from diskguard.retention.limits import Limits, stand
from diskguard.retention.order import HeadKey
from diskguard.retention.planner import Deletion, _Context, _deletion, placed


def _made() -> tuple[Deletion, HeadKey]:
    part = Partition("/data/logs", "orders", 3, "/data/logs/orders-3", (0, 100, 200), 0)
    info = SegmentInfo(8192, 1_700_000_000_000, "timeindex", ("/data/logs/orders-3/a.log",), ())
    key = HeadKey(1_700_000_000_000, True, False, "orders", 3, 0, "/data/logs")
    following = HeadKey(1_700_000_000_500, False, False, "orders", 4, 0, "/data/logs")
    fs = FilesystemUsage("/data", "/dev/x", 100 << 20, 90 << 20, 10 << 20)
    standing = stand(fs, Limits(limit_percent=80.0, target_percent=70.0), 0)
    held = ((key, 0, part, info, 100, {"readers": 40}), "disk_usage_percent", 7)
    return _deletion(held, following, "/data", _Context(standing, {})), key


def test_a_walks_deletion_is_the_constructors() -> None:
    made, _key = _made()
    assert set(vars(made)) == {f.name for f in fields(Deletion)}
    rebuilt = Deletion(**{f.name: getattr(made, f.name) for f in fields(Deletion)})
    assert made == rebuilt and repr(made) == repr(rebuilt)
    assert made.unconsumed_records == {"readers": 60} and made.why is not None
    assert (made.leader, made.replicas, made.also_trims) == (None, (), ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.bytes = 1  # type: ignore[misc]


def test_placed_is_replace() -> None:
    made, _key = _made()
    got = placed(made, 2, (2, 1, 3), (2, 3))
    assert got == replace(made, leader=2, replicas=(2, 1, 3), also_trims=(2, 3))
    assert set(vars(got)) == {f.name for f in fields(Deletion)}
    assert made.leader is None  # the original is untouched
