"""spark-submit entry point of the fleet job: ``spark-submit daemon/diskguard/sparkjob.py``.

Only the command line and its exit codes (the same as ``diskguard aggregate``); the job is
:mod:`diskguard.fleet.job`, shipped to the cluster with ``--py-files`` (see
``docs/aggregate.md``). This file stays at this path and stands alone: spark-submit runs it
as a script, possibly copied away from the package. It imports nothing from the CLI.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:  # pragma: no cover - spark-submit entry
    # spark-submit runs this file as a script: sys.path[0] is this package's directory, whose
    # modules (config, model, ...) must not shadow top-level ones; and a checkout that is not
    # installed still needs `import diskguard` to work on the driver.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    try:
        import diskguard  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.dirname(_here))


# after the sys.path fix above, so that these resolve to the package
import argparse
from collections.abc import Sequence

from diskguard.errors import DiskguardError, ExitCode
from diskguard.fleet.job import aggregate, summaries_location
from diskguard.fleet.session import DEFAULT_MASTER


def _days(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: same contract and exit codes as ``diskguard aggregate``."""
    parser = argparse.ArgumentParser(
        prog="sparkjob.py", description="diskguard fleet aggregation (Spark)"
    )
    parser.add_argument(
        "--input", required=True, help="spool dir, glob, or kafka://host:port/topic"
    )
    parser.add_argument("--output", required=True, help="output directory or hdfs:// / s3a:// URI")
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master (default: spark-submit's, or local[*] when run with plain python)",
    )
    parser.add_argument(
        "--incremental",
        action="store_true",
        help="keep daily summaries in OUTPUT/summaries and fold only new snapshots into them",
    )
    parser.add_argument(
        "--summaries", default=None, help="keep the daily summaries here; implies --incremental"
    )
    parser.add_argument(
        "--days", type=_days, default=None, help="report on the last N days summarised"
    )
    parser.add_argument(
        "--kafka-config",
        default=None,
        help="librdkafka settings (key=value lines) for a kafka:// input's cluster",
    )
    args = parser.parse_args(argv)
    master = args.master
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = DEFAULT_MASTER
    try:
        where = summaries_location(args.output, args.summaries, args.incremental)
        result = aggregate(
            args.input,
            args.output,
            master,
            summaries=where,
            days=args.days,
            kafka_config=args.kafka_config,
        )
    except DiskguardError as exc:  # bad input: 2; Spark or the Kafka source failed: 1
        print(f"diskguard aggregate: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    for line in result.lines():
        print(line)
    return int(ExitCode.OK)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
