"""One owner of "over, and by how much": ``Ceilings`` builds every filesystem's limits from the
config and sums what is pending; ``limits.stand`` is the rule. A source check holds that no
other module reads the retention limit keys or applies the rule itself."""

from __future__ import annotations

import ast
from pathlib import Path

from diskguard.config import load_config
from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir
from diskguard.retention.ceilings import Ceilings, PendingReclaim
from diskguard.retention.mode import BROKER, DRY_RUN, OFFLINE
from diskguard.retention.planner import DeletionResult, FilesystemPlan, Plan
from diskguard.retention.reclaim import Forecast
from support.configs import write_config
from support.planning import MiB

PACKAGE = Path(__file__).resolve().parents[2] / "daemon" / "diskguard"


def _usage(used: int, capacity: int = 1000 * MiB, mount: str = "/data") -> FilesystemUsage:
    return FilesystemUsage(mount, "/dev/x", capacity, used, capacity - used)


def _fs(used: int, pending: int = 0) -> Filesystem:
    return Filesystem(_usage(used), (LogDir("/data/k", "/data", (), pending),))


def _ceilings(tmp_path: Path, forecast: Forecast | None = None, **retention: object) -> Ceilings:
    (tmp_path / "logs").mkdir(exist_ok=True)
    config = load_config(write_config(tmp_path, tmp_path / "logs", **retention))
    return Ceilings(config, (lambda _mount: forecast) if forecast else None)


FORECAST = Forecast(
    growth_bytes_per_s=4 * MiB,
    latency_s=10.0,
    period_s=15.0,
    latency_source="settings",
    near_check=False,
)


def test_the_limits_of_each_mode_come_from_the_config(tmp_path: Path) -> None:
    ceilings = _ceilings(
        tmp_path,
        FORECAST,
        disk_usage_percent=70,
        target_percent=60,
        max_bytes="5MiB",
        offline_headroom="1MiB",
    )
    offline = ceilings.limits(OFFLINE, "/data")
    assert (offline.limit_percent, offline.target_percent) == (70.0, 60.0)
    assert (offline.max_bytes, offline.headroom_bytes) == (5 * MiB, MiB)
    assert offline.growth_bytes == 0  # files go at once: no look-ahead
    broker = ceilings.limits(BROKER, "/data")
    assert broker.headroom_bytes == 0 and broker.growth_bytes == 40 * MiB
    assert ceilings.limits(BROKER, "/data", forecast=False).growth_bytes == 0
    assert ceilings.limits(DRY_RUN, "/data").growth_bytes == 0
    assert (ceilings.limit_percent, ceilings.target_percent, ceilings.byte_budget) == (
        70.0,
        60.0,
        True,
    )
    assert _ceilings(tmp_path, disk_usage_percent=80).target_percent == 80.0


def test_over_by_how_much_with_what_pending(tmp_path: Path) -> None:
    ceilings = _ceilings(tmp_path, disk_usage_percent=70, target_percent=60)
    over = ceilings.standing(_usage(750 * MiB), OFFLINE, pending=20 * MiB)
    assert over.over and not over.predicted_only and over.over_usage
    assert over.excess_bytes == 750 * MiB - 20 * MiB - 600 * MiB
    under = ceilings.standing(_usage(650 * MiB), OFFLINE, pending=0)
    assert not under.over and under.excess_bytes == 0
    assert ceilings.over_usage(_usage(701 * MiB)) and not ceilings.over_usage(_usage(700 * MiB))
    assert ceilings.room_above_ceiling(_usage(100 * MiB)) == 300 * MiB


def test_the_forecast_triggers_only_in_broker_mode(tmp_path: Path) -> None:
    ceilings = _ceilings(tmp_path, FORECAST, disk_usage_percent=70)
    # 601 + 40 until freed + 60 over the next period > 700: over by prediction alone.
    broker = ceilings.standing(_usage(601 * MiB), BROKER, pending=0)
    assert broker.over and broker.predicted_only
    assert not ceilings.standing(_usage(601 * MiB), OFFLINE, pending=0).over
    assert ceilings.may_need_space(_usage(601 * MiB), BROKER)
    predicted = ceilings.predicted(_usage(601 * MiB), BROKER)
    assert predicted is not None and predicted.used_bytes == 641 * MiB
    assert ceilings.predicted(_usage(601 * MiB), OFFLINE) is None


def test_pending_is_the_scan_plus_what_the_broker_accepted_less_what_was_freed(
    tmp_path: Path,
) -> None:
    ceilings = _ceilings(tmp_path, disk_usage_percent=70)
    assert ceilings.pending("/data") == 0
    ceilings.scanned([_fs(500 * MiB, pending=30 * MiB)], {"/data": 10 * MiB})
    assert ceilings.pending("/data") == 40 * MiB
    ceilings.freed("/data", 15 * MiB)  # the newest part (requested) goes first
    assert ceilings.pending("/data") == 25 * MiB
    ceilings.freed("/data", 100 * MiB)
    assert ceilings.pending("/data") == 0
    # ``standing`` counts what is pending now unless told otherwise.
    ceilings.scanned([_fs(750 * MiB, pending=60 * MiB)], {})
    assert ceilings.standing(_usage(750 * MiB), OFFLINE).excess_bytes == 0
    ceilings.forget("/data")
    assert ceilings.pending("/data") == 0
    assert PendingReclaim(5, 3).less(4) == PendingReclaim(4, 0)


def test_the_planner_sees_each_filesystem_net_of_its_pending(tmp_path: Path) -> None:
    ceilings = _ceilings(tmp_path, disk_usage_percent=70, target_percent=70)
    standing = ceilings.standing_of(OFFLINE)(_fs(750 * MiB, pending=30 * MiB))
    assert standing.pending_bytes == 30 * MiB and standing.excess_bytes == 20 * MiB


def _plan_fs(used: int, pending: int) -> FilesystemPlan:
    usage = _usage(used)
    return FilesystemPlan(
        mount="/data",
        device="/dev/x",
        log_dirs=("/data/k",),
        total_bytes=usage.total_bytes,
        used_bytes=used,
        available_bytes=usage.available_bytes,
        usage_percent=usage.usage_percent,
        limit_percent=70.0,
        target_percent=70.0,
        pending_reclaim_bytes=pending,
        excess_bytes=0,
    )


def test_after_a_cycle_what_the_broker_will_still_remove_counts_as_gone(tmp_path: Path) -> None:
    from diskguard.retention.planner import Deletion

    ceilings = _ceilings(tmp_path, disk_usage_percent=70)
    fs = _plan_fs(720 * MiB, pending=10 * MiB)
    plan = Plan((fs,), ())
    d = Deletion("/data/k", "t", 0, 0, 10, 1, 15 * MiB, (), "/data")
    results = [DeletionResult(d, True, 15 * MiB, BROKER)]
    left, settled = ceilings.settle(BROKER, plan, results, {"/data": _usage(720 * MiB)})
    assert left == {"/data": 25 * MiB}
    standing = settled["/data"]
    assert standing is not None and not standing.over  # 720 - 25 = 695 MiB <= 700
    # Offline, nobody else removes anything: only what is gone counts.
    left, settled = ceilings.settle(OFFLINE, plan, results, {"/data": _usage(720 * MiB)})
    assert left == {"/data": 0} and settled["/data"] is not None and settled["/data"].over
    # A failed measurement is not "under".
    assert ceilings.settle(BROKER, plan, results, {"/data": None})[1] == {"/data": None}


# -- nobody else reads the limits or applies the rule ----------------------------------------

#: The config's retention limit keys (``config.retention.<key>``): the owner reads them.
LIMIT_KEYS = {"disk_usage_percent", "target_percent", "effective_target_percent", "max_bytes"}
LIMIT_KEYS_ANYWHERE = {"disk_usage_percent", "effective_target_percent", "offline_headroom"}
#: Calls that build limits or apply the rule -> the modules allowed to make them.
CALLS = {
    "Limits": {"retention/limits.py", "retention/ceilings.py"},
    "stand": {"retention/limits.py", "retention/ceilings.py", "retention/planner.py"},
    "room_above_ceiling": {"retention/limits.py", "retention/ceilings.py"},
    "with_forecast": {"retention/limits.py", "retention/ceilings.py"},
    # "Usage above a percent" on the exact bytes: the model's rule, the pure limits, the
    # plan's own record; status colours a row by the limit its JSON recorded.
    "above": {
        "kafkalog/model.py",
        "retention/limits.py",
        "retention/planner.py",
        "commands/status.py",
    },
}


def _stray(name: str, tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and name not in ("config.py", "retention/ceilings.py"):
            owner = node.value
            of_retention = (isinstance(owner, ast.Attribute) and owner.attr == "retention") or (
                isinstance(owner, ast.Name) and owner.id == "retention"
            )
            if node.attr in LIMIT_KEYS_ANYWHERE or (of_retention and node.attr in LIMIT_KEYS):
                found.append(f"{name}:{node.lineno}: reads .{node.attr}")
        if isinstance(node, ast.Call):
            func = node.func
            # A function called by name; ``above`` is a method (the owner's own methods of the
            # same names are how everyone else asks).
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if isinstance(func, ast.Attribute) and called != "above":
                continue
            if called in CALLS and name not in CALLS[called]:
                found.append(f"{name}:{node.lineno}: calls {called}()")
    return found


def test_no_module_reads_the_limits_or_applies_the_rule_but_the_owner() -> None:
    stray = []
    for module in sorted(PACKAGE.rglob("*.py")):
        name = str(module.relative_to(PACKAGE))
        stray += _stray(name, ast.parse(module.read_text()))
    assert stray == []


def test_the_stray_read_check_sees_what_it_must() -> None:
    code = (
        "x = config.retention.disk_usage_percent\n"
        "y = cfg.retention.max_bytes\n"
        "z = Limits(1, 2)\n"
        "w = usage.above(3)\n"
        "v = spool.max_bytes\n"
    )
    assert [s.split(": ", 1)[1] for s in _stray("daemon/x.py", ast.parse(code))] == [
        "reads .disk_usage_percent",
        "reads .max_bytes",
        "calls Limits()",
        "calls above()",
    ]


def test_well_under_leaves_a_margin_and_the_growth_until_the_next_rescan(tmp_path: Path) -> None:
    plain = _ceilings(tmp_path, disk_usage_percent=70, target_percent=60)
    assert plain.well_under(_usage(600 * MiB), span_s=60.0)
    # Under the ceiling today, but within the margin (1 % of the disk) of it: not quiet.
    assert not plain.standing(_usage(695 * MiB), OFFLINE).over
    assert not plain.well_under(_usage(695 * MiB), span_s=60.0)
    # A margin as large as the free space would fill the disk: never quiet, whatever the ceiling.
    everything = _ceilings(tmp_path, disk_usage_percent=100, target_percent=60)
    assert everything.well_under(_usage(600 * MiB), span_s=0.0, margin_bytes=399 * MiB)
    assert not everything.well_under(_usage(600 * MiB), span_s=0.0, margin_bytes=400 * MiB)
    # At 4 MiB/s the next rescan (60 s), the reclaim latency (10 s) and a check period (15 s)
    # are 340 MiB of growth: 400 MiB is not over today nor by the forecast, yet not quiet.
    slow = Forecast(4 * MiB, 10.0, 15.0, "settings", horizon_s=5.0, send_in_s=30.0)
    ahead = _ceilings(tmp_path, slow, disk_usage_percent=70, target_percent=60)
    assert not ahead.standing(_usage(400 * MiB), BROKER).over
    assert not ahead.well_under(_usage(400 * MiB), span_s=60.0)
    assert ahead.well_under(_usage(340 * MiB), span_s=60.0)
    # A shrinking disk is no reason to be nearer: its rate counts as none.
    shrinking = _ceilings(
        tmp_path, Forecast(-4 * MiB, 10.0, 15.0, "settings"), disk_usage_percent=70
    )
    assert not shrinking.well_under(_usage(695 * MiB), span_s=60.0)
    assert shrinking.well_under(_usage(600 * MiB), span_s=60.0)


def test_a_byte_budget_is_never_well_under(tmp_path: Path) -> None:
    budget = _ceilings(tmp_path, disk_usage_percent=70, target_percent=60, max_bytes="5MiB")
    assert not budget.well_under(_usage(1 * MiB), span_s=60.0)
