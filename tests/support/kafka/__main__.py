"""``python -m support.kafka`` (``PYTHONPATH=tests``): the harness as a command.

    classpath [RELEASE]            resolve (and cache) a release's jars; print how many
    start ROOT [options] [K=V...]  start a cluster in ROOT; print ``bootstrap HOST:PORT,...``
    stop ROOT | kill ROOT          controlled shutdown / kill -9 of what ROOT's start began

Errors are one line on stderr and exit 1 (2 for bad usage).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from support.kafka import KafkaResolutionError, target
from support.kafka import node as servers
from support.kafka.broker import acl_settings, fast_retention
from support.kafka.cluster import KafkaCluster
from support.kafka.node import ServerSetupError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m support.kafka")
    sub = ap.add_subparsers(dest="command", required=True)
    cp = sub.add_parser("classpath")
    cp.add_argument("release", nargs="?")
    start = sub.add_parser("start")
    start.add_argument("root", type=Path)
    start.add_argument("--release", help="e.g. 4.4.0 (default: the environment's, else newest)")
    start.add_argument("--mode", choices=("kraft", "zk"))
    start.add_argument("--nodes", type=int, default=1)
    start.add_argument(
        "--log-dirs",
        action="append",
        default=[],
        help="comma-separated log dirs of the next node (repeat once per node)",
    )
    start.add_argument("--fast-retention", action="store_true")
    start.add_argument("--acl", action="store_true", help="the release's permissive authorizer")
    start.add_argument("--heap-mb", type=int, default=320)
    start.add_argument("settings", nargs="*", metavar="KEY=VALUE")
    for name in ("stop", "kill"):
        sub.add_parser(name).add_argument("root", type=Path)
    args = ap.parse_args(argv)
    servers.OUTLIVE_STARTER = True  # what `start` began runs on after this command exits
    try:
        if args.command == "classpath":
            chosen = target(args.release)
            print(f"{chosen}: {len(chosen.classpath)} jars")
        elif args.command == "start":
            return _start(args)
        else:
            cluster = KafkaCluster.load(args.root)
            if args.command == "stop":
                cluster.stop()
            else:
                for node in cluster.nodes:
                    node.kill()
    except (KafkaResolutionError, ServerSetupError, OSError, ValueError) as exc:
        print(
            f"support.kafka: {exc}".splitlines()[0]
            if args.command != "start"
            else f"support.kafka: {exc}",
            file=sys.stderr,
        )
        return 1
    return 0


def _start(args: argparse.Namespace) -> int:
    if (args.root / "cluster.json").exists():
        # Started here before: the same release, ports and dirs again (a restart).
        cluster = KafkaCluster.load(args.root)
        cluster.start()
        print(f"bootstrap {cluster.bootstrap}")
        return 0
    chosen = target(args.release, args.mode)
    dirs = [[Path(p) for p in spec.split(",")] for spec in args.log_dirs]
    while len(dirs) < args.nodes:
        dirs.append([args.root / f"node-{len(dirs) + 1}" / "kafka-logs"])
    settings: dict[str, str] = {}
    if args.fast_retention:
        settings |= fast_retention(chosen.release)
    if args.acl:
        settings |= acl_settings(chosen.release, chosen.mode)
    for item in args.settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r}: want KEY=VALUE")
        settings[key] = value
    cluster = KafkaCluster(
        chosen.release,
        chosen.classpath,
        args.root,
        dirs[: args.nodes],
        mode=chosen.mode,
        settings=settings,
        heap_mb=args.heap_mb,
    )
    cluster.start()
    print(f"bootstrap {cluster.bootstrap}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
