"""`raftlog cluster up|down|status|reassign|decommission`: a local cluster of node processes
(no Docker needed). `cluster reassign` starts moving a partition's replicas: the
move is recorded by the controller and carried out by the partition leader, one Raft
membership change at a time; `--wait` blocks until DescribeTopic shows the new replicas.
`cluster decommission NODE` takes an observer out: its replicas move to other
nodes one at a time, then it leaves the metadata quorum; `--wait` blocks until
DescribeCluster shows it decommissioned (then stop its process).

`cluster up` on a directory holding a stopped cluster restarts that cluster (its node ids,
data and security flags; its recorded ports where free, new ones otherwise, said so); a
different `--nodes` is an error. It passes TLS and auth options to every node (`--tls-cert`,
`--tls-key`, `--tls-ca`, `--peer-tls`, `--auth-tokens`, `--tls-client-ca`, as `raftlog serve`
takes them), checked first as a node would check them. It waits for a controller as a
client of the cluster: over TLS trusting `--tls-ca`, with the token file's node token (read
in memory, never printed) and, where nodes require client certificates, the node
certificate. `--auto-create-topics` has every node create the topics its Kafka clients name
(`--set kafka.auto_create_topics_enable=true`, kept on a restart).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from raftlog.errors import ConfigError
from raftlog.local_cluster import CLUSTER_FILE, LocalCluster

__all__ = ["add_cluster_parser", "reassign_partition", "wait_for_controller"]


# Options naming files, as (flag, help), in the order `--help` lists them.
_NODE_SECURITY_FILES = (
    ("--tls-cert", "PEM certificate chain of the nodes"),
    ("--tls-key", "PEM private key of --tls-cert"),
    ("--tls-ca", "PEM CA bundle that signs node certs"),
)
_NODE_AUTH_FILES = (
    ("--auth-tokens", "TOML token file (auth, ACLs)"),
    ("--tls-client-ca", "require client certificates"),
)
# What `--auto-create-topics` passes to every node.
_AUTO_CREATE_FLAGS = ("--set", "kafka.auto_create_topics_enable=true")
_CLIENT_CERTIFICATE_FILES = (
    ("--tls-cert", "PEM client certificate (mutual TLS)"),
    ("--tls-key", "PEM private key of --tls-cert"),
)


def _add_files(parser: Any, files: tuple[tuple[str, str], ...]) -> None:
    """Add one `Path` option per (flag, help) to `parser` (a parser or an argument group)."""
    for flag, text in files:
        parser.add_argument(flag, type=Path, help=text)


def _cluster_parent() -> argparse.ArgumentParser:
    """--dir and --bootstrap, shared by the commands that talk to a running cluster: the
    cluster started in --dir, or the nodes in --bootstrap (`client_cli.resolve_bootstrap`)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--dir", type=Path, default=None)
    parent.add_argument("--bootstrap", default=None)
    return parent


def add_cluster_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("cluster", help="start, stop or inspect a local cluster")
    commands = parser.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND", required=True)
    cluster = _cluster_parent()
    up = commands.add_parser("up", help="start N node processes on loopback")
    up.add_argument("--nodes", type=int, choices=(1, 3, 5), default=3)
    up.add_argument("--dir", type=Path, required=True, help="data and state directory")
    up.add_argument(
        "--base-port", type=int, help="client ports base+1..N, raft ports +100, metrics +50"
    )
    up.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a controller")
    up.add_argument(
        "--no-metrics",
        action="store_true",
        help="no Prometheus endpoints (default: node N serves http://127.0.0.1:base+50+N/metrics)",
    )
    up.add_argument(
        "--auto-create-topics",
        action="store_true",
        help="Kafka clients create the topics they name (kafka.auto_create_topics_enable)",
    )
    security = up.add_argument_group("security, passed to every node (docs/security.md)")
    _add_files(security, _NODE_SECURITY_FILES)
    security.add_argument("--peer-tls", action="store_true", help="mutual TLS between nodes")
    _add_files(security, _NODE_AUTH_FILES)
    up.set_defaults(func=_up)
    down = commands.add_parser("down", help="stop the cluster started in --dir")
    down.add_argument("--dir", type=Path, required=True)
    down.set_defaults(func=_down)
    status = commands.add_parser(
        "status", parents=[cluster], help="nodes, controller, partition leaders and lag"
    )
    status.add_argument("--tls-ca", type=Path, help="PEM CA of the nodes (default: --dir's)")
    status.add_argument("--token", help="bearer token (default: $RAFTLOG_TOKEN, else --dir's)")
    _add_files(status, _CLIENT_CERTIFICATE_FILES)
    status.set_defaults(func=_status)
    reassign = commands.add_parser(
        "reassign", parents=[cluster], help="move a partition to other replicas"
    )
    reassign.add_argument("--topic", required=True)
    reassign.add_argument("--partition", type=int, required=True)
    reassign.add_argument(
        "--replicas", required=True, help="node ids, comma-separated, preferred leader first"
    )
    reassign.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the end")
    reassign.set_defaults(func=_reassign)
    decommission = commands.add_parser(
        "decommission",
        parents=[cluster],
        help="move every replica off an observer node and retire it",
    )
    decommission.add_argument("node", type=int, metavar="NODE", help="the node id")
    decommission.add_argument(
        "--wait", type=float, nargs="?", const=600.0, default=0.0,
        help="wait (up to SECONDS, default 600) until the node is decommissioned",
    )  # fmt: skip
    decommission.set_defaults(func=_decommission)


def wait_for_controller(
    bootstrap: str, *, timeout_s: float, at_bootstrap: bool = False, **client_options: Any
) -> int:
    """Block until some node names a controller that all nodes agree is registered; with
    `at_bootstrap`, registered at their `bootstrap` addresses (a local cluster restarted on
    new ports: the replayed registrations name the old ones until each node registers again;
    not behind a port mapping, where nodes register the addresses they see).

    `client_options` (tls_ca, token, tls_cert, tls_key) reach the Admin client.
    """
    from raftlog.client import Admin

    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin = Admin(bootstrap, **client_options)
            try:
                cluster = admin.describe_cluster()
            finally:
                admin.close()
            addresses = bootstrap.split(",")
            registered = {node.address for node in cluster.nodes}
            everyone = (
                set(addresses) <= registered if at_bootstrap else len(registered) >= len(addresses)
            )
            if cluster.controller_id is not None and everyone:
                return cluster.controller_id
        except Exception as error:
            last_error = error
        time.sleep(0.2)
    raise TimeoutError(f"no controller within {timeout_s:.0f}s (last error: {last_error})")


def node_security(args: argparse.Namespace) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(flags for every node, options for this command's own client), validated as a node
    validates them. Paths are made absolute so a later restart from elsewhere finds them."""
    from raftlog.settings import NodeSettings
    from raftlog.tls import TlsFiles
    from raftlog.types import NodeId

    paths = {
        name: None if getattr(args, name) is None else Path(getattr(args, name)).resolve()
        for name in ("tls_cert", "tls_key", "tls_ca", "auth_tokens", "tls_client_ca")
    }
    loopback = ("127.0.0.1", 0)
    NodeSettings(
        node_id=NodeId(1), data_dir=args.dir, listen=loopback, raft_listen=loopback,
        peers={NodeId(1): loopback}, peer_tls=args.peer_tls, tls_cert=paths["tls_cert"],
        tls_key=paths["tls_key"], tls_ca=paths["tls_ca"], auth_tokens=paths["auth_tokens"],
        tls_client_ca=paths["tls_client_ca"],
    ).validate()  # fmt: skip
    if paths["tls_cert"] is not None and paths["tls_key"] is not None:
        TlsFiles(cert=paths["tls_cert"], key=paths["tls_key"], ca=paths["tls_ca"]).validate()
    flags = [
        part
        for name, path in paths.items()
        if path is not None
        for part in ("--" + name.replace("_", "-"), str(path))
    ]
    flags += ["--peer-tls"] if args.peer_tls else []
    return tuple(flags), _node_client_options(paths)


def _node_client_options(paths: Mapping[str, Path | None]) -> dict[str, Any]:
    """How a command run beside the nodes talks to them: TLS trusting their CA, the token
    file's node token (kept in memory), the node certificate where clients need one."""
    from raftlog.rpc.security import load_access_control

    tokens = paths.get("auth_tokens")
    access = None if tokens is None else load_access_control(tokens)
    client: dict[str, Any] = {
        "tls_ca": paths.get("tls_ca") if paths.get("tls_cert") is not None else None,
        "token": None if access is None else access.node_token,
    }
    if paths.get("tls_client_ca") is not None:
        client.update(tls_cert=paths.get("tls_cert"), tls_key=paths.get("tls_key"))
    return client


def _status_client_options(args: argparse.Namespace) -> dict[str, Any]:
    """Flags, then $RAFTLOG_TOKEN, then what `cluster up` gave the nodes in --dir."""
    import os

    options: dict[str, Any] = {}
    if args.dir is not None:
        try:
            flags = LocalCluster.load(args.dir).node_flags
        except FileNotFoundError:
            flags = ()
        options = _node_client_options(_flag_paths(flags))
    explicit = {
        "tls_ca": args.tls_ca,
        "token": args.token or os.environ.get("RAFTLOG_TOKEN") or None,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
    }
    options.update({name: value for name, value in explicit.items() if value is not None})
    return options


def _up(args: argparse.Namespace) -> int:
    try:
        node_flags, client = node_security(args)
    except ConfigError as error:
        print(f"raftlog cluster up: {error}", file=sys.stderr)
        return 2
    if (args.dir / CLUSTER_FILE).exists():
        try:
            cluster, client = _restart_stopped(args, node_flags, client)
        except (ValueError, FileNotFoundError) as error:
            print(f"raftlog cluster up: {error}", file=sys.stderr)
            return 2
    else:
        cluster = LocalCluster.create(
            args.dir,
            node_count=args.nodes,
            base_port=args.base_port,
            node_flags=node_flags + (_AUTO_CREATE_FLAGS if args.auto_create_topics else ()),
            metrics=not args.no_metrics,
        )
        print(f"starting {args.nodes} nodes in {args.dir} ...", file=sys.stderr)
    cluster.start()
    try:
        controller = wait_for_controller(
            cluster.bootstrap, timeout_s=args.timeout, at_bootstrap=True, **client
        )
    except TimeoutError as error:
        cluster.stop()
        print(f"raftlog cluster up: {error}; logs in {args.dir}/node-*.log", file=sys.stderr)
        return 1
    print(f"controller: node {controller}", file=sys.stderr)
    for node in cluster.nodes.values():
        if node.metrics_port:
            print(
                f"node {node.node_id} metrics: http://{node.metrics_address}/metrics",
                file=sys.stderr,
            )
    # The Kafka listeners' bootstrap on its own line; the last line stays the gRPC one.
    print(f"kafka: {cluster.kafka_bootstrap}")
    print(cluster.bootstrap)
    return 0


def _restart_stopped(
    args: argparse.Namespace, node_flags: tuple[str, ...], client: dict[str, Any]
) -> tuple[LocalCluster, dict[str, Any]]:
    """The stopped cluster of --dir, ready to start again (its ids, data and ports where free),
    and how this command talks to it. Security flags given now replace the recorded ones;
    --auto-create-topics turns auto-creation on (it stays as recorded without it)."""
    if args.base_port is not None:
        raise ValueError(f"--base-port: {args.dir} holds a cluster with its own ports")
    cluster, moved = LocalCluster.restart_stopped(args.dir, node_count=args.nodes)
    recorded = cluster.node_flags
    auto_create = args.auto_create_topics or _has_flags(recorded, _AUTO_CREATE_FLAGS)
    if node_flags:
        cluster.node_flags = node_flags
    else:
        cluster.node_flags = _without_flags(recorded, _AUTO_CREATE_FLAGS)
        client = _node_client_options(_flag_paths(cluster.node_flags))
    cluster.node_flags += _AUTO_CREATE_FLAGS if auto_create else ()
    if cluster.node_flags != recorded:
        cluster.save()
    running = [node_id for node_id in sorted(cluster.nodes) if cluster.is_running(node_id)]
    stopped = [node_id for node_id in sorted(cluster.nodes) if node_id not in running]
    if not running:
        ids = ", ".join(map(str, stopped))
        print(f"restarting the stopped cluster in {args.dir} (nodes {ids}) ...", file=sys.stderr)
    elif stopped:
        print(
            f"restarting nodes {stopped} of the cluster in {args.dir} (nodes {running} run)",
            file=sys.stderr,
        )
    else:
        print(f"every node of the cluster in {args.dir} runs already", file=sys.stderr)
    for line in moved:
        print(f"  {line}", file=sys.stderr)
    return cluster, client


def _has_flags(flags: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    return any(flags[i : i + len(wanted)] == wanted for i in range(len(flags)))


def _without_flags(flags: tuple[str, ...], unwanted: tuple[str, ...]) -> tuple[str, ...]:
    for i in range(len(flags)):
        if flags[i : i + len(unwanted)] == unwanted:
            return flags[:i] + flags[i + len(unwanted) :]
    return flags


def _flag_paths(flags: tuple[str, ...]) -> dict[str, Path]:
    """The file options among node flags (`--tls-ca PATH` -> {"tls_ca": PATH})."""
    import itertools

    return {
        flag[2:].replace("-", "_"): Path(value)
        for flag, value in itertools.pairwise(flags)
        if flag.startswith("--") and not value.startswith("--")
    }


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
    from raftlog.client_cli import leaders_offsets, resolve_bootstrap

    bootstrap = resolve_bootstrap(args.bootstrap, args.dir)
    try:
        admin = Admin(bootstrap, **_status_client_options(args))
    except ConfigError as error:
        print(f"raftlog cluster status: {error}", file=sys.stderr)
        return 2
    try:
        cluster = admin.describe_cluster()
        print(f"cluster {cluster.cluster_id}: controller node {cluster.controller_id}")
        for node in cluster.nodes:
            print(
                f"  node {node.node_id} {node.address} {'alive' if node.alive else 'FENCED'} "
                f"{node.state} metadata {node.metadata_role}"
            )
        for name in admin.list_topics():
            topic = admin.describe_topic(name)
            offsets = leaders_offsets(bootstrap, _status_client_options(args), topic)
            for p in topic.partitions:
                print(
                    f"  {name}-{p.id}: leader {p.leader} epoch {p.epoch} replicas "
                    f"{list(p.replicas)} high watermark {offsets[p.id][1]}"
                    + (
                        f" moving: adding {list(p.adding_replicas)} removing "
                        f"{list(p.removing_replicas)}"
                        if p.adding_replicas or p.removing_replicas
                        else ""
                    )
                )
    finally:
        admin.close()
    _print_metrics_status(args.dir)
    return 0


def _print_metrics_status(directory: Path | None) -> None:
    """Replication and consumer lag, from the metrics endpoints of a local cluster's nodes."""
    from raftlog.metrics.status import read_node, status_lines

    try:
        cluster = LocalCluster.load(directory) if directory is not None else None
    except FileNotFoundError:
        cluster = None
    nodes = [] if cluster is None else [n for n in cluster.nodes.values() if n.metrics_port]
    if not nodes:
        print(
            "replication and consumer lag: no metrics endpoints known (--dir of a cluster "
            "started by `cluster up` with metrics)"
        )
        return
    for line in status_lines(read_node(n.node_id, n.metrics_address) for n in nodes):
        print(line)


def reassign_partition(
    bootstrap: str, topic: str, partition: int, replicas: list[int], *, timeout_s: float
) -> None:
    """Start moving `topic`-`partition` to `replicas` (the first is the preferred leader).

    Submits a ReassignPartition command through `Internal.SubmitMetadata` to whichever node
    answers as controller; returns once the controller committed the move (not once it
    completed). Raises ValueError with the controller's reason when it refuses the move
    (unknown topic, wrong replica count, a move already under way, ...), TimeoutError when
    no controller answered within `timeout_s`.
    """
    import grpc

    from raftlog.metadata import ReassignPartition, encode_command
    from raftlog.rpc.v1 import raftlog_pb2 as pb
    from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
    from raftlog.types import NodeId, PartitionId

    command = ReassignPartition(topic, PartitionId(partition), tuple(NodeId(n) for n in replicas))
    request = pb.SubmitMetadataRequest(command=encode_command(command), timeout_ms=10_000)
    deadline = time.monotonic() + timeout_s
    last_error: object = None
    while time.monotonic() < deadline:
        for address in bootstrap.split(","):
            with grpc.insecure_channel(address) as channel:
                try:
                    response = pb_grpc.InternalStub(channel).SubmitMetadata(request, timeout=15)  # type: ignore[no-untyped-call]
                except grpc.RpcError as error:
                    last_error = error
                    continue
            if response.HasField("error") and response.error.code != pb.NONE:
                last_error = response.error.message  # not the controller, or an election
                continue
            if response.result_code != "NONE":
                raise ValueError(f"{response.result_code}: {response.result_message}")
            return
        time.sleep(0.2)
    raise TimeoutError(f"no controller took the move within {timeout_s:.0f}s: {last_error}")


def _reassign(args: argparse.Namespace) -> int:
    from raftlog.client import Admin
    from raftlog.client_cli import resolve_bootstrap

    try:
        replicas = [int(n) for n in args.replicas.split(",")]
    except ValueError:
        print(
            f"raftlog cluster reassign: --replicas {args.replicas!r}: expected ids like 2,3",
            file=sys.stderr,
        )
        return 2
    bootstrap = resolve_bootstrap(args.bootstrap, args.dir)
    try:
        reassign_partition(bootstrap, args.topic, args.partition, replicas, timeout_s=30)
    except (ValueError, TimeoutError) as error:
        print(f"raftlog cluster reassign: {error}", file=sys.stderr)
        return 1
    print(f"moving {args.topic}-{args.partition} to {replicas}", file=sys.stderr)

    def moved(admin: Admin) -> bool:
        partitions = admin.describe_topic(args.topic).partitions
        return any(p.id == args.partition and list(p.replicas) == replicas for p in partitions)

    with Admin(bootstrap) as admin:
        return _wait_and_report(
            lambda: moved(admin),
            wait_s=args.wait,
            interval_s=0.2,
            reached="move completed",
            missed=f"the move did not complete within {args.wait:.0f}s",
        )


def _decommission(args: argparse.Namespace) -> int:
    from raftlog.client import Admin
    from raftlog.client.errors import ClientError
    from raftlog.client_cli import resolve_bootstrap

    admin = Admin(resolve_bootstrap(args.bootstrap, args.dir))
    try:
        try:
            admin.decommission_node(args.node)
        except ClientError as error:
            print(f"raftlog cluster decommission: {error}", file=sys.stderr)
            return 1
        print(f"decommissioning node {args.node}", file=sys.stderr)

        def decommissioned() -> bool:
            nodes = admin.describe_cluster().nodes
            node = next((n for n in nodes if n.node_id == args.node), None)
            return node is not None and node.state == "decommissioned"

        return _wait_and_report(
            decommissioned,
            wait_s=args.wait,
            interval_s=0.5,
            reached=f"node {args.node} is decommissioned: stop its process",
            missed=f"node {args.node} was not decommissioned within {args.wait:.0f}s",
        )
    finally:
        admin.close()


def _wait_and_report(
    done: Callable[[], bool], *, wait_s: float, interval_s: float, reached: str, missed: str
) -> int:
    """Poll `done` every `interval_s` for up to `wait_s` seconds (not at all without a wait);
    the exit status: 0 once it holds (saying `reached`) or without a wait, 1 when a wait ran
    out (saying `missed`)."""
    assert interval_s > 0, interval_s
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if done():
            print(reached, file=sys.stderr)
            return 0
        time.sleep(interval_s)
    if wait_s > 0:
        print(missed, file=sys.stderr)
        return 1
    return 0
