"""Human units in config and output: sizes like ``"50GiB"`` and durations like ``"5s"``.

Operators write sizes the way Kafka and Redpanda docs do, so both IEC (KiB, MiB, GiB) and
SI (KB, MB, GB) suffixes are accepted; a bare integer is bytes / seconds.
"""

from __future__ import annotations

import math
import re

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

_DURATION_UNITS: dict[str, float] = {
    "": 1.0,
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}

_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | float | str) -> int:
    """Bytes from ``1073741824``, ``"1GiB"``, ``"512 MB"``; raises ValueError with the reason.

    Booleans are not sizes (TOML ``true`` is not 1 byte), and nothing above ``MAX_SIZE_BYTES``
    is: a larger number is a typo that would overflow every file-size call it reaches.
    """
    if isinstance(value, bool):
        raise ValueError('expected a size such as 1073741824 or "1GiB", got a boolean')
    if isinstance(value, int | float):
        if not _finite_non_negative(value):
            raise ValueError(f"size must be a finite number >= 0, got {_short(value)}")
        return _size_in_range(value, value)
    if not isinstance(value, str):
        raise ValueError(f'expected a size such as "50GiB" or 1073741824, got {value!r}')
    match = _NUMBER_UNIT.match(value)
    if not match:
        raise ValueError(f'expected a size such as "50GiB" or "512MB", got {_short(value)}')
    number, unit = match.groups()
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(
            f"unknown size unit {unit!r} in {_short(value)} "
            "(use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
        )
    return _size_in_range(float(number) * factor, value)


def parse_duration(value: int | float | str) -> float:
    """Seconds from ``5``, ``"5s"``, ``"250ms"``, ``"1m"``; raises ValueError with the reason.

    Booleans are not durations, and nothing above ``MAX_DURATION_S`` is: a longer timer is a
    typo, and some (``threading.Event.wait``) raise OverflowError instead of waiting.
    """
    if isinstance(value, bool):
        raise ValueError('expected a duration such as "5s", got a boolean')
    if isinstance(value, int | float):
        if not _finite_non_negative(value):
            raise ValueError(f"duration must be a finite number >= 0, got {_short(value)}")
        return _duration_in_range(value, value)
    if not isinstance(value, str):
        raise ValueError(f'expected a duration such as "5s" or 5, got {value!r}')
    match = _NUMBER_UNIT.match(value)
    if not match:
        raise ValueError(f'expected a duration such as "5s" or "250ms", got {_short(value)}')
    number, unit = match.groups()
    factor = _DURATION_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown duration unit {unit!r} in {_short(value)} (use ms, s, m, h, d)")
    return _duration_in_range(float(number) * factor, value)


#: The largest size: a Java long and Linux's off_t, so any size Kafka or the kernel can hold.
MAX_SIZE_BYTES = 2**63 - 1
#: The longest duration any diskguard timer or timeout may have.
MAX_DURATION_S = 365 * 86400.0


def _finite_non_negative(value: int | float) -> bool:
    # ints compare exactly (no float conversion: 10**400 would overflow it).
    return value >= 0 if isinstance(value, int) else math.isfinite(value) and value >= 0


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _size_in_range(amount: int | float, original: object) -> int:
    if amount > MAX_SIZE_BYTES:  # also float('inf') from a 400-digit string
        raise ValueError(f"size must be at most 8EiB (2**63-1 bytes), got {_short(original)}")
    return int(amount)


def _duration_in_range(seconds: int | float, original: object) -> float:
    if seconds > MAX_DURATION_S:
        raise ValueError(f"duration must be at most 365d, got {_short(original)}")
    return float(seconds)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 host``, ``2 hosts``: a count a person reads (``many`` for irregular plurals)."""
    return f"{n} {word}" if n == 1 else f"{n} {many or word + 's'}"


def format_bytes(n: int | float) -> str:
    """``1536`` -> ``"1.5 KiB"``: for tables and log messages a person reads."""
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


#: 9999-12-31 23:59:59.999 UTC: the last instant Python's ``datetime`` can represent.
MAX_DATETIME_MS = 253_402_300_799_999


def format_timestamp_ms(ms: int) -> str:
    """A Kafka record timestamp as UTC ``YYYY-MM-DD HH:MM:SS``, whatever its value.

    Timestamps are whatever producers send: one sending microseconds gives values Kafka reads
    as milliseconds past year 9999, where ``datetime`` raises. Those are written with ISO 8601's
    signed expanded year (``+55840-...``) and flagged with the unit that makes them plausible,
    so a person sees both what Kafka orders by and what the producer meant.
    """
    text = _utc_text(ms)
    if ms > MAX_DATETIME_MS:
        for unit, divisor in (("µs", 1000), ("ns", 1000**2)):
            if ms // divisor <= MAX_DATETIME_MS:
                return f"{text} (timestamp looks like {unit}: {_utc_text(ms // divisor)})"
        return f"{text} (past year 9999)"
    return text


def format_timestamp_ms_utc(ms: int) -> str:
    """``format_timestamp_ms`` with its zone said (``... 22:13:20 UTC``): a bare time reads
    as local to whoever looks."""
    head, sep, tail = format_timestamp_ms(ms).partition(" (")
    return f"{head} UTC{sep}{tail}"


def _utc_text(ms: int) -> str:
    days, rest = divmod(ms, 86_400_000)
    year, month, day = _civil_from_days(days)
    seconds = rest // 1000
    year_text = f"{year:04d}" if 0 < year <= 9999 else f"{year:+05d}"
    return (
        f"{year_text}-{month:02d}-{day:02d} "
        f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    )


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """Proleptic Gregorian ``(year, month, day)`` of ``days`` since 1970-01-01, for any int
    (H. Hinnant's ``civil_from_days``; Python's floor division makes it exact for negatives)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day
