"""What an incremental run reads onto the driver ahead of its report (no Spark: the fold and
the report are stood in for; the summaries directory is a real one on disk).

``--days`` bounds the report, not what the summaries keep: a year of daily runs keeps a
year of days. The driver reads the window's days while the fold runs, oldest first in one
thread; read ahead past the window, every day ever summarised came onto the driver (memory)
and before the window's own (time), for a report that reads N of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diskguard.fleet import job
from diskguard.fleet.manifest import DayMark, Manifest
from diskguard.fleet.store import MANIFESTS, SummaryStore

_DAYS = [f"2026-{m:02d}-{d:02d}" for m in (1, 2) for d in range(1, 29)]


def _summaries(tmp_path: Path) -> Path:
    location = tmp_path / "summaries"
    (location / MANIFESTS).mkdir(parents=True)
    days = {day: DayMark("0000000001-0a1b2c3d", 10) for day in _DAYS}
    (location / MANIFESTS / "0000000001.json").write_text(Manifest(1, days).to_json())
    return location


@pytest.mark.parametrize("window", [3, None])
def test_the_read_ahead_reads_the_report_s_window_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int | None
) -> None:
    read: list[str] = []

    def day_columns(
        _store: SummaryStore, _table: str, names: tuple[str, ...], day: str, _version: str
    ) -> dict[str, list[Any]]:
        read.append(day)
        return {name: [] for name in names}

    def report(_spark: Any, store: SummaryStore, *_args: Any) -> str:
        for ahead in list(store._ahead.values()):
            ahead.result(timeout=60)
        return "reported"

    monkeypatch.setattr(SummaryStore, "_day_columns", day_columns)
    monkeypatch.setattr(job, "fold", lambda *_a: None)
    monkeypatch.setattr(job, "_report", report)
    got = job.run_aggregation(
        None,  # type: ignore[arg-type]  # a local summaries directory needs no Spark here
        None,  # type: ignore[arg-type]
        tmp_path / "out",
        summaries=_summaries(tmp_path),
        days=window,
    )
    assert got == "reported"
    wanted = _DAYS[-window:] if window else _DAYS
    assert sorted(set(read)) == wanted, f"read ahead {len(set(read))} days for a window of {window}"
