"""The daily summaries on the driver, as plain columns (:data:`diskguard.fleet.window.Columns`).

The report reads a window's summaries onto the driver: from local Parquet files with pyarrow
(:class:`diskguard.fleet.store.SummaryStore`), or from Spark as Arrow batches (a remote
directory, or a full recompute's summaries as the fold writes them). Both end as the same
columns.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pyspark.sql import Column, DataFrame

from diskguard.errors import FailedError

Disk = tuple[str, str]
POINT_COLUMNS = ("host", "mount", "ts_ms", "used_bytes", "available_bytes")


def columns_of(table: Any) -> dict[str, list[Any]]:
    """A pyarrow table as plain columns (:data:`diskguard.fleet.window.Columns`).

    ``decimal(38,0)`` values become Python integers straight from their two 64-bit
    halves: through ``decimal.Decimal`` they would cost several times as much.
    """
    import pyarrow as pa

    found: dict[str, list[Any]] = {}
    for name, chunked in zip(table.column_names, table.columns, strict=True):
        if not pa.types.is_decimal(chunked.type) or chunked.type.scale != 0:
            found[name] = chunked.to_pylist()
            continue
        if sys.byteorder != "little" or chunked.type.bit_width != 128:
            found[name] = [None if v is None else int(v) for v in chunked.to_pylist()]
            continue
        values: list[Any] = []
        for chunk in chunked.chunks:
            words = memoryview(chunk.buffers()[1])
            first, end = 2 * chunk.offset, 2 * (chunk.offset + len(chunk))
            low = words.cast("Q")[first:end:2].tolist()
            high = words.cast("q")[first + 1 : end : 2].tolist()
            ints: list[int | None] = [(h << 64) + lo for h, lo in zip(high, low, strict=True)]
            if chunk.null_count:
                valid = chunk.is_valid().to_pylist()
                ints = [v if ok else None for v, ok in zip(ints, valid, strict=True)]
            values += ints
        found[name] = values
    return found


@contextmanager
def unreadable(location: str) -> Iterator[None]:
    """A summaries file the driver cannot read: one line naming it, not a traceback."""
    import pyarrow as pa

    try:
        yield
    except (OSError, pa.ArrowException) as exc:
        raise FailedError(f"cannot read the summaries in {location}: {exc}") from None


def points_of(disk_days: DataFrame, chosen: Sequence[Disk]) -> DataFrame:
    """The chosen disks' snapshots (``POINT_COLUMNS``), from their days' points."""
    from pyspark.sql import functions as F

    match: Column = F.lit(False)
    for host, mount in chosen:
        match = match | ((F.col("host") == F.lit(host)) & (F.col("mount") == F.lit(mount)))
    return (
        disk_days.where(match)
        .select("host", "mount", F.explode("points").alias("p"))
        .select("host", "mount", "p.ts_ms", "p.used_bytes", "p.available_bytes")
    )


def spark_columns(df: DataFrame | None, names: Sequence[str]) -> dict[str, list[Any]]:
    """Columns of a (small) result, collected as Arrow: one job, no per-row pickling."""
    if df is None:
        return {name: [] for name in names}
    return columns_of(df.select(*names).toArrow())
