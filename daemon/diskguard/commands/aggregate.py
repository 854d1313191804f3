"""``diskguard aggregate``: the fleet Spark job, with an embedded ``local[*]`` Spark.

The job itself lives in :mod:`diskguard.fleet.job` (which must also run under spark-submit
without this CLI); its errors carry their exit codes (bad input 2, Spark or the Kafka source
failing 1), which ``no_traceback`` turns into one line.
"""

from __future__ import annotations

import click

from diskguard.cli import no_traceback


@click.command("aggregate")
@click.option(
    "--input",
    "source",
    required=True,
    help="Spool directory, glob of JSONL files, or kafka://host:port/topic.",
)
@click.option(
    "--output",
    "output",
    required=True,
    help="Directory (or hdfs:// / s3a:// URI) for disks/topics/hosts.parquet, summary.json"
    " and report.html.",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option(
    "--incremental",
    is_flag=True,
    help="Keep daily summaries in OUTPUT/summaries and fold only new snapshots into them.",
)
@click.option(
    "--summaries",
    default=None,
    help="Keep the daily summaries here (directory or URI); implies --incremental.",
)
@click.option(
    "--days",
    type=click.IntRange(min=1),
    default=None,
    help="Report on the last N days summarised (default: all).",
)
@click.option(
    "--kafka-config",
    "kafka_config",
    default=None,
    metavar="FILE",
    help="librdkafka settings (key=value lines) for a kafka:// input's cluster:"
    " security.protocol, sasl.*, ssl.*.",
)
@no_traceback
def aggregate_command(
    source: str,
    output: str,
    master: str,
    incremental: bool,
    summaries: str | None,
    days: int | None,
    kafka_config: str | None,
) -> None:
    """Aggregate usage snapshots: growth, time to full, overfull history, report."""
    import sys

    from diskguard.progress import progress

    # Starting Spark takes seconds (JVM, then the job) before anything else is said: a person
    # at a terminal hears at once that it is coming and sees it run; pipes get nothing extra.
    if sys.stderr.isatty():
        click.echo(f"starting Spark ({master}); the first results take a few seconds", err=True)
    # Imported here: pyspark is heavy, and `diskguard --help` loads every command module.
    from diskguard.fleet.job import aggregate, summaries_location

    where = summaries_location(output, summaries, incremental)
    with progress(None, "Spark: aggregating snapshots"):
        result = aggregate(
            source, output, master, summaries=where, days=days, kafka_config=kafka_config
        )
    for line in result.lines():
        click.echo(line)
