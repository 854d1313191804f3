"""The ``--json`` encoder (``retention.report.dumps``): orjson's speed, the json module's text.

``plan --json`` of 10,000 deletions is 8.6 MB; orjson writes it in a seventh of the json
module's time. What a reader parses must not change with the encoder: the same bytes where
orjson can write them, the json module's otherwise (non-ASCII text it would not escape, an
integer past 64 bits, a string with lone surrogates from an undecodable file name).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskguard.retention.report import dumps

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_VALUES)
def test_compact_output_parses_to_what_the_json_module_writes(value: Any) -> None:
    out = dumps(value, pretty=False)
    assert json.loads(out) == json.loads(json.dumps(value))
    assert out.isascii()


@pytest.mark.parametrize(
    "value",
    [
        {"path": "/data/kafka-logs/héllo-0", "n": 1},  # non-ASCII: escaped as before
        {"offset": 2**64 + 1},  # past 64 bits: orjson refuses
        {"file": "/data/\udcff-0"},  # a lone surrogate (os.fsdecode of a non-UTF-8 name)
    ],
    ids=["non-ascii", "big-int", "surrogate"],
)
def test_what_orjson_would_write_differently_is_the_json_modules_text(value: Any) -> None:
    assert dumps(value, pretty=False) == json.dumps(
        value, separators=(",", ":"), check_circular=False
    )


def test_a_plan_shaped_value_is_byte_for_byte_the_json_modules() -> None:
    deletion = {
        "log_dir": "/data/kafka-logs",
        "topic": "orders",
        "partition": 3,
        "base_offset": 0,
        "files": ["/data/kafka-logs/orders-3/00000000000000000000.log"],
        "why": {"limit_percent": 35.3546875, "usage_percent": 39.261, "before": None},
        "replicas": (1, 2),
        "unconsumed_records": {},
    }
    value = {"deletions": [deletion] * 3, "mode": "offline", "growth_bytes_per_s": 0.0}
    assert dumps(value, pretty=False) == json.dumps(
        value, separators=(",", ":"), check_circular=False
    )
