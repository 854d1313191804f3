"""recordbatch header walking on real .log bytes (generated; cross-checked with kafka-python)."""

from __future__ import annotations

import os
import struct
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.kafkalog import recordbatch
from diskguard.kafkalog.recordbatch import CorruptLog
from support.kafkagen import encode_batch

T0 = 1_700_000_000_000


def _log(path: Path, batches: list[tuple[list[int], int]]) -> list[int]:
    """Write batches of (timestamps, payload size); returns their positions."""
    data = bytearray()
    positions = []
    offset = 0
    for timestamps, size in batches:
        positions.append(len(data))
        data += encode_batch(offset, timestamps, [b"v" * size] * len(timestamps))
        offset += len(timestamps)
    path.write_bytes(bytes(data))
    return positions


def test_generator_bytes_match_kafka_python_builder() -> None:
    """An independent Kafka client encodes the same batch byte for byte."""
    with warnings.catch_warnings():  # kafka-python's import-time DeprecationWarnings
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

    timestamps = [T0, T0 + 500, T0 - 1000]
    values = [b"a" * 10, b"", b"xyz" * 50]
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, (ts, value) in enumerate(zip(timestamps, values, strict=True)):
        builder.append(i, timestamp=ts, key=None, value=value, headers=[])
    assert encode_batch(0, timestamps, values) == bytes(builder.build())
    decoded = DefaultRecordBatch(encode_batch(0, timestamps, values))
    assert decoded.validate_crc()
    assert [r.timestamp for r in decoded] == timestamps


def test_iter_batches_reads_every_header(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.log"
    positions = _log(path, [([T0 + i, T0 + i + 5], 100 * i) for i in range(20)])
    headers = list(recordbatch.iter_batches(path, verify_crc=True))
    assert [h.position for h in headers] == positions
    assert [h.base_offset for h in headers] == list(range(0, 40, 2))
    assert headers[-1].next_offset == 40
    assert all(h.magic == 2 and h.record_count == 2 for h in headers)
    assert headers[3].max_timestamp == T0 + 8
    assert headers[3].base_timestamp == T0 + 3
    assert sum(h.size_in_bytes for h in headers) == path.stat().st_size
    assert not headers[0].is_transactional and not headers[0].is_control


def test_last_batch_max_timestamp_from_hint(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    positions = _log(path, [([T0 + 10 * i], 50) for i in range(30)])
    assert recordbatch.last_batch_max_timestamp(path) == T0 + 290
    assert recordbatch.last_batch_max_timestamp(path, positions[25]) == T0 + 290
    assert recordbatch.last_batch_max_timestamp(path, path.stat().st_size) is None


def test_last_batch_is_not_the_max_of_all(tmp_path: Path) -> None:
    """CreateTime is the producer's clock: the last batch may be older than an earlier one."""
    path = tmp_path / "0.log"
    _log(path, [([T0 + 1000], 10), ([T0], 10)])
    assert recordbatch.last_batch_max_timestamp(path) == T0


def test_empty_log(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(b"")
    assert list(recordbatch.iter_batches(path)) == []
    assert recordbatch.last_batch_max_timestamp(path) is None


def test_truncated_tail_stops_cleanly_at_every_cut(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    positions = _log(path, [([T0], 30), ([T0 + 1], 30), ([T0 + 2], 30)])
    full = path.read_bytes()
    for cut in range(positions[2], len(full)):
        path.write_bytes(full[:cut])
        headers = list(recordbatch.iter_batches(path, verify_crc=True))
        assert [h.position for h in headers] == positions[:2], cut
        assert recordbatch.last_batch_max_timestamp(path) == T0 + 1


def test_preallocated_zero_tail_stops(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    _log(path, [([T0], 30), ([T0 + 7], 30)])
    os.truncate(path, 1024 * 1024)
    assert len(list(recordbatch.iter_batches(path, verify_crc=True))) == 2
    assert recordbatch.last_batch_max_timestamp(path) == T0 + 7


def test_crc_mismatch_names_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.log"
    positions = _log(path, [([T0], 30), ([T0 + 1], 30)])
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a payload byte of the second batch
    path.write_bytes(bytes(data))
    assert len(list(recordbatch.iter_batches(path))) == 2  # headers alone are fine
    with pytest.raises(CorruptLog) as info:
        list(recordbatch.iter_batches(path, verify_crc=True))
    assert info.value.position == positions[1]
    assert str(path) in str(info.value) and f"position {positions[1]}" in str(info.value)


def test_bad_magic_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    _log(path, [([T0], 30)])
    data = bytearray(path.read_bytes())
    data[16] = 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLog, match="magic 1"):
        recordbatch.last_batch_max_timestamp(path)


def test_tiny_batch_length_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(struct.pack(">qi", 5, 10) + bytes(100))
    with pytest.raises(CorruptLog, match="too small"):
        list(recordbatch.iter_batches(path))


def test_offsets_going_backwards_are_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(encode_batch(10, [T0], [b"a"]) + encode_batch(3, [T0], [b"b"]))
    with pytest.raises(CorruptLog, match="below the previous"):
        list(recordbatch.iter_batches(path))


def test_start_position_past_end_and_negative(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    _log(path, [([T0], 30)])
    assert list(recordbatch.iter_batches(path, 10_000)) == []
    with pytest.raises(CorruptLog):
        list(recordbatch.iter_batches(path, -1))


def test_many_small_batches_across_read_windows(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    positions = _log(path, [([T0 + i], 1 + (i * 37) % 3000) for i in range(400)])
    assert path.stat().st_size > 3 * 64 * 1024
    headers = list(recordbatch.iter_batches(path, verify_crc=True))
    assert [h.position for h in headers] == positions
    assert recordbatch.last_batch_max_timestamp(path) == T0 + 399


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=800), prefix=st.booleans())
def test_garbage_raises_corrupt_log_or_stops(data: bytes, prefix: bool) -> None:
    """Never struct.error or IndexError: only CorruptLog or a clean stop."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "0.log"
        head = encode_batch(0, [T0], [b"ok"]) if prefix else b""
        path.write_bytes(head + data)
        try:
            list(recordbatch.iter_batches(path, verify_crc=True))
        except CorruptLog as exc:
            assert str(path) in str(exc)


@settings(max_examples=100, deadline=None)
@given(
    batches=st.lists(
        st.tuples(st.lists(st.integers(0, 2**40), min_size=1, max_size=5), st.integers(0, 2000)),
        min_size=1,
        max_size=30,
    )
)
def test_roundtrip_random_batches(batches: list[tuple[list[int], int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "0.log"
        positions = _log(path, batches)
        headers = list(recordbatch.iter_batches(path, verify_crc=True))
        assert [h.position for h in headers] == positions
        assert [h.max_timestamp for h in headers] == [max(ts) for ts, _ in batches]
        assert recordbatch.last_batch_max_timestamp(path, positions[-1]) == max(batches[-1][0])
