"""The `raftlog` command line: `serve`, `cluster`, `topic`, `produce`, `consume`, `txn`, ...

Every command has `--help`, prints errors as one clear line on stderr and exits non-zero on
any failure (2 for bad usage or settings, 1 for operational errors).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from raftlog import __version__

__all__ = ["build_parser", "main"]

# Each entry adds one subcommand; modules stay independent of each other.
_REGISTRARS: list[tuple[str, str]] = [
    ("raftlog.serve", "add_serve_parser"),
    ("raftlog.cluster_cli", "add_cluster_parser"),
    ("raftlog.client_cli", "add_client_parsers"),
    ("raftlog.txn_cli", "add_txn_parser"),
    ("raftlog.chaos.cli", "add_chaos_parser"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftlog",
        description="A distributed commit log with Kafka's model and Raft's guarantees.",
    )
    parser.add_argument("--version", action="version", version=f"raftlog {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name, function_name in _REGISTRARS:
        module = __import__(module_name, fromlist=[function_name])
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None] = getattr(
            module, function_name
        )
        register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
