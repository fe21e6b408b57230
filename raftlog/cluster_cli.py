"""`raftlog cluster up|down|status`: a local cluster of node processes (no Docker needed)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from raftlog.local_cluster import LocalCluster

__all__ = ["add_cluster_parser", "wait_for_controller"]


def add_cluster_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("cluster", help="start, stop or inspect a local cluster")
    commands = parser.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND", required=True)
    up = commands.add_parser("up", help="start N node processes on loopback")
    up.add_argument("--nodes", type=int, choices=(1, 3, 5), default=3)
    up.add_argument("--dir", type=Path, required=True, help="data and state directory")
    up.add_argument("--base-port", type=int, help="client ports base+1..N, raft ports +100")
    up.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a controller")
    up.set_defaults(func=_up)
    down = commands.add_parser("down", help="stop the cluster started in --dir")
    down.add_argument("--dir", type=Path, required=True)
    down.set_defaults(func=_down)
    status = commands.add_parser("status", help="nodes, controller, partition leaders and lag")
    status.add_argument("--dir", type=Path, default=None)
    status.add_argument("--bootstrap", default=None)
    status.set_defaults(func=_status)


def wait_for_controller(bootstrap: str, *, timeout_s: float) -> int:
    """Block until some node names a controller that all nodes agree is registered."""
    from raftlog.client import Admin

    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin = Admin(bootstrap)
            try:
                cluster = admin.describe_cluster()
            finally:
                admin.close()
            expected = len(bootstrap.split(","))
            if cluster.controller_id is not None and len(cluster.nodes) >= expected:
                return cluster.controller_id
        except Exception as error:
            last_error = error
        time.sleep(0.2)
    raise TimeoutError(f"no controller within {timeout_s:.0f}s (last error: {last_error})")


def _up(args: argparse.Namespace) -> int:
    cluster = LocalCluster.create(args.dir, node_count=args.nodes, base_port=args.base_port)
    print(f"starting {args.nodes} nodes in {args.dir} ...", file=sys.stderr)
    cluster.start()
    try:
        controller = wait_for_controller(cluster.bootstrap, timeout_s=args.timeout)
    except TimeoutError as error:
        cluster.stop()
        print(f"raftlog cluster up: {error}; logs in {args.dir}/node-*.log", file=sys.stderr)
        return 1
    print(f"controller: node {controller}", file=sys.stderr)
    print(cluster.bootstrap)
    return 0


def _down(args: argparse.Namespace) -> int:
    try:
        cluster = LocalCluster.load(args.dir)
    except FileNotFoundError as error:
        print(f"raftlog cluster down: {error}", file=sys.stderr)
        return 1
    cluster.stop()
    print(f"stopped {len(cluster.nodes)} nodes", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    from raftlog.client import Admin
    from raftlog.client_cli import resolve_bootstrap

    bootstrap = resolve_bootstrap(args.bootstrap, args.dir)
    admin = Admin(bootstrap)
    try:
        cluster = admin.describe_cluster()
        print(f"cluster {cluster.cluster_id}: controller node {cluster.controller_id}")
        for node in cluster.nodes:
            print(f"  node {node.node_id} {node.address} {'alive' if node.alive else 'FENCED'}")
        for name in admin.list_topics():
            for p in admin.describe_topic(name).partitions:
                print(
                    f"  {name}-{p.id}: leader {p.leader} epoch {p.epoch} replicas "
                    f"{list(p.replicas)} high watermark {p.high_watermark}"
                )
    finally:
        admin.close()
    return 0
