"""Exact integer sums in Spark, as 64-bit sums of 32-bit halves.

The daily summaries' least-squares sums (:mod:`diskguard.fleet.daily`) are exact
``decimal(38,0)`` integers, but Spark computes a decimal(38,0) sum with ``BigDecimal`` on
every row. Here a term (a non-negative long below 2^63: a product of two larger values is
split into such terms, :func:`x_times`, :func:`squared`) is split into its high and low 32
bits, each summed as a long in generated code (no overflow before 2^31 rows of a group: a
disk-day holds at most one snapshot per millisecond, 2^27), and the halves are weighed and
added as decimal(38,0) once per group: the very integer a decimal sum of every term gives.
"""

from __future__ import annotations

from decimal import Decimal

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType

EXACT = DecimalType(38, 0)
_LOW_32 = 0xFFFFFFFF
Term = tuple[Column, int]  # (a non-negative long below 2^63, the power of two it is worth)


def x_times(x: Column, v: Column) -> list[Term]:
    """``x * v`` for 0 <= x < 2^27 (ms in a day) and 0 <= v <= 2^53 (bytes): each product
    below 2^59."""
    return [(x * v.bitwiseAND(F.lit(_LOW_32)), 0), (x * F.shiftright(v, 32), 32)]


def squared(v: Column) -> list[Term]:
    """``v * v`` for 0 <= v <= 2^53 (bytes), as v = h * 2^31 + l: each product below 2^62."""
    low, high = v.bitwiseAND(F.lit((1 << 31) - 1)), F.shiftright(v, 31)
    return [(low * low, 0), (F.lit(2) * low * high, 31), (high * high, 62)]


def _weight(power: int) -> Column:
    return F.lit(Decimal(1 << power)).cast(EXACT)


class ExactSums:
    """Exact sums over a grouping: :meth:`add` gives the aggregates (the halves' long sums),
    :meth:`total` the decimal(38,0) column that adds them up after the grouping."""

    def __init__(self) -> None:
        self.aggregates: list[Column] = []
        self._totals: dict[str, Column] = {}

    def add(self, name: str, terms: list[Term], where: Column | None = None) -> None:
        total: Column | None = None
        for i, (term, power) in enumerate(terms):
            value = term if where is None else F.when(where, term)
            high, low = f"_{name}_{i}_high", f"_{name}_{i}_low"
            self.aggregates += [
                F.sum(F.shiftright(value, 32)).alias(high),
                F.sum(value.bitwiseAND(F.lit(_LOW_32))).alias(low),
            ]
            weighed = F.col(high).cast(EXACT) * _weight(32 + power) + (
                F.col(low).cast(EXACT) * _weight(power) if power else F.col(low).cast(EXACT)
            )
            total = weighed if total is None else total + weighed
        assert total is not None
        self._totals[name] = total.cast(EXACT)

    def total(self, name: str) -> Column:
        return self._totals[name]
