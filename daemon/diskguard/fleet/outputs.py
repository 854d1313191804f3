"""The job's Parquet outputs: their schemas (a contract, docs/aggregate.md) and writing them.

The rows are computed on the driver (:mod:`diskguard.fleet.window`); a local directory gets
them from pyarrow directly, a remote one (hdfs://, s3a://) through Spark. Either way a
table is a directory with one part file, in the rows' order.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from diskguard.fleet.filesystem import Storage, is_remote, local_path

_DRIVER_BATCH_ROWS = 1000

# disks.parquet: the columns, their order and types are a contract (docs/aggregate.md)
DISKS_SCHEMA = StructType(
    [
        StructField("host", StringType()),
        StructField("mount", StringType()),
        StructField("device", StringType()),
        StructField("snapshots", LongType(), nullable=False),
        *[
            StructField(name, LongType())
            for name in (
                "first_ts_ms",
                "last_ts_ms",
                "total_bytes",
                "used_bytes",
                "available_bytes",
                "kafka_bytes",
                "pending_reclaim_bytes",
            )
        ],
        *[
            StructField(name, DoubleType())
            for name in (
                "growth_bytes_per_hour",
                "kafka_growth_bytes_per_hour",
                "non_kafka_growth_bytes_per_hour",
            )
        ],
        StructField("overfull_episodes", LongType()),
        StructField("overfull_seconds", DoubleType()),
        StructField("deleted_bytes", LongType()),
        StructField("peak_alert_level", IntegerType()),
        StructField("flow_state", StringType()),
        StructField("alert_level", IntegerType()),
        *[
            StructField(name, DoubleType())
            for name in ("hours_to_full", "used_ratio", "growth_r2", "growth_residual_bytes")
        ],
        StructField("forecast_status", StringType(), nullable=False),
        StructField("first_overfull_ts_ms", LongType()),
    ]
)

_TOPIC_DISK = StructType(
    [
        StructField("host", StringType()),
        StructField("mount", StringType()),
        StructField("bytes", LongType()),
        StructField("share", DoubleType()),
        StructField("growth_bytes_per_hour", DoubleType()),
    ]
)
# topics.parquet and hosts.parquet: contracts too (docs/aggregate.md)
TOPICS_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("bytes", LongType()),
        StructField("growth_bytes_per_hour", DoubleType()),
        StructField("partitions", LongType()),
        StructField("disk_count", LongType()),
        StructField("disks", ArrayType(_TOPIC_DISK)),
    ]
)
HOSTS_SCHEMA = StructType(
    [
        StructField("host", StringType()),
        StructField("disks", LongType()),
        *[
            StructField(name, LongType())
            for name in ("last_ts_ms", "total_bytes", "used_bytes", "available_bytes")
        ],
        StructField("kafka_bytes", LongType()),
        StructField("growth_bytes_per_hour", DoubleType()),
        StructField("min_hours_to_full", DoubleType()),
        StructField("overfull_episodes", LongType()),
        *[
            StructField(name, DoubleType())
            for name in ("used_ratio", "fleet_mean_used_ratio", "skew")
        ],
    ]
)


def _driver_frame(
    spark: SparkSession, found: list[dict[str, Any]], schema: StructType
) -> DataFrame:
    """Rows computed on the driver as a DataFrame, handed to the JVM as Arrow batches.

    From a list of dicts Spark would pickle the rows and have Python workers re-serialise
    them each time the frame is computed (the topics' join, the hosts, the write): worker
    start-ups that cost seconds apiece on a busy machine. Arrow data is decoded in the JVM.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema)
    # one partition per batch: batches small enough that no task carries a megabyte
    batches = [
        pa.RecordBatch.from_pylist(found[i : i + _DRIVER_BATCH_ROWS], schema=arrow)
        for i in range(0, len(found), _DRIVER_BATCH_ROWS)
    ]
    return spark.createDataFrame(pa.Table.from_batches(batches, arrow), schema)


def write_parquet(
    spark: SparkSession, path: str, found: list[dict[str, Any]], schema: StructType
) -> None:
    """Rows computed on the driver as a Parquet directory with one part file, in order.

    Locally written with pyarrow (no Spark job); elsewhere (hdfs://, s3a://) through Spark.
    """
    if is_remote(path):
        _driver_frame(spark, found, schema).coalesce(1).write.mode("overwrite").parquet(path)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    directory = Path(local_path(path))
    Storage(spark, str(directory)).delete(str(directory))
    directory.mkdir(parents=True)
    table = pa.Table.from_pylist(found, schema=to_arrow_schema(schema))
    pq.write_table(
        table, directory / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet", compression="snappy"
    )
    (directory / "_SUCCESS").touch()
