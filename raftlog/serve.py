"""`raftlog serve`: run one node until SIGTERM or SIGINT.

The node refuses to start under `python -O` (raftlog/__init__.py) and on any invalid
setting, naming it. Logs go to stderr; the first line after start says where it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from raftlog.errors import ConfigError
from raftlog.settings import (
    NodeSettings,
    apply_overrides,
    parse_address,
    parse_bootstrap,
    parse_peers,
    settings_from_toml,
)
from raftlog.types import NodeId

__all__ = ["add_serve_parser", "run_on_loop", "run_serve"]

log = logging.getLogger(__name__)


def add_serve_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help="run a raftlog node")
    parser.add_argument("--config", type=Path, help="TOML file with a [node] table")
    parser.add_argument("--node-id", type=int)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--listen", help="client API HOST:PORT (gRPC)")
    parser.add_argument("--advertise", help="client API address others should use")
    parser.add_argument("--raft-listen", help="node-to-node HOST:PORT (default: listen port+100)")
    parser.add_argument("--raft-advertise", help="node-to-node address others should use")
    parser.add_argument("--kafka-listen", help="Kafka wire-protocol HOST:PORT (default: none)")
    parser.add_argument(
        "--kafka-advertise", help="Kafka address clients are told (advertised.listeners)"
    )
    parser.add_argument(
        "--peers", help="metadata quorum voters as ID=HOST:PORT,... (their node-to-node addresses)"
    )
    parser.add_argument(
        "--bootstrap",
        help="observers (a --node-id not in --peers): client HOST:PORT,... of the voters, "
        "used to register with the controller",
    )
    parser.add_argument("--cluster-id", default=None)
    parser.add_argument(
        "--chaos",
        action="store_true",
        help="enable the fault-injection hook (Internal.SetFaults); for chaos tests only",
    )
    parser.add_argument(
        "--chaos-skip-fsync",
        action="store_true",
        help="UNSAFE, with --chaos only: never fsync (shows what the chaos checker catches)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config bound, e.g. raft.election_timeout_ticks=20 (repeatable)",
    )
    parser.add_argument("--log-level", default="INFO")
    # Security settings (docs/security.md).
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate chain of this node")
    parser.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    parser.add_argument("--tls-ca", type=Path, help="PEM CA bundle that signs node certificates")
    parser.add_argument(
        "--peer-tls", action="store_true", help="mutual TLS between nodes (needs --tls-ca)"
    )
    parser.add_argument("--auth-tokens", type=Path, help="TOML token file (client auth, ACLs)")
    parser.add_argument(
        "--tls-client-ca",
        type=Path,
        help="PEM CA of client certificates: clients must present one (mutual TLS); its CN "
        "is the principal (needs --tls-cert, --tls-key and --auth-tokens for permissions)",
    )
    parser.add_argument(
        "--metrics-listen",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (docs/metrics.md)",
    )
    parser.set_defaults(func=run_serve)


def settings_from_args(args: argparse.Namespace) -> NodeSettings:
    settings = _base_settings(args)
    # Flags win over the TOML file.
    flags: dict[str, Any] = {
        name: getattr(args, name, None)
        for name in ("tls_cert", "tls_key", "tls_ca", "auth_tokens", "tls_client_ca")
        if getattr(args, name, None) is not None
    }
    if getattr(args, "peer_tls", False):
        flags["peer_tls"] = True
    if flags:
        settings = dataclasses.replace(settings, **flags).validate()
    if getattr(args, "metrics_listen", None):
        metrics_listen = parse_address(args.metrics_listen, setting="--metrics-listen")
        settings = dataclasses.replace(settings, metrics_listen=metrics_listen).validate()
    kafka: dict[str, Any] = {
        name: parse_address(getattr(args, name), setting="--" + name.replace("_", "-"))
        for name in ("kafka_listen", "kafka_advertise")
        if getattr(args, name, None)
    }
    if kafka:
        settings = dataclasses.replace(settings, **kafka).validate()
    if getattr(args, "chaos_skip_fsync", False):
        settings = dataclasses.replace(settings, chaos_skip_fsync=True).validate()
    if not args.overrides:
        return settings
    config = apply_overrides(settings.config, args.overrides)
    return dataclasses.replace(settings, config=config).validate()


def _base_settings(args: argparse.Namespace) -> NodeSettings:
    if args.config is not None:
        return settings_from_toml(
            args.config,
            node_id=args.node_id,
            data_dir=str(args.data_dir) if args.data_dir else None,
            listen=args.listen,
            raft_listen=args.raft_listen,
            peers=args.peers,
            advertise=args.advertise,
            raft_advertise=args.raft_advertise,
            cluster_id=args.cluster_id,
            chaos=args.chaos or None,
            bootstrap=getattr(args, "bootstrap", None),
        )
    missing = [
        flag
        for flag, value in (
            ("--node-id", args.node_id),
            ("--data-dir", args.data_dir),
            ("--listen", args.listen),
            ("--peers", args.peers),
        )
        if value is None
    ]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)} (or give --config FILE)")
    listen = parse_address(args.listen, setting="--listen")
    raft_listen = (
        parse_address(args.raft_listen, setting="--raft-listen")
        if args.raft_listen
        else (listen[0], listen[1] + 100)
    )
    return NodeSettings(
        node_id=NodeId(args.node_id),
        data_dir=args.data_dir,
        listen=listen,
        raft_listen=raft_listen,
        peers=parse_peers(args.peers),
        advertise=parse_address(args.advertise, setting="--advertise") if args.advertise else None,
        raft_advertise=parse_address(args.raft_advertise, setting="--raft-advertise")
        if args.raft_advertise
        else None,
        cluster_id=args.cluster_id or "raftlog",
        chaos=args.chaos,
        bootstrap=parse_bootstrap(args.bootstrap) if getattr(args, "bootstrap", None) else (),
    ).validate()


def run_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = settings_from_args(args)
    except ConfigError as error:
        print(f"raftlog serve: {error}", file=sys.stderr)
        return 2
    from raftlog.node.process import run_node

    return run_on_loop(run_node(settings), settings.config.event_loop)


def run_on_loop(main: Coroutine[Any, Any, int], event_loop: str) -> int:
    """Run `main` to completion on the event loop `event_loop` names (NodeConfig.event_loop)."""
    if event_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("event_loop=uvloop but uvloop is not installed: running on asyncio's")
        else:
            log.info("event loop: uvloop")
            return uvloop.run(main)
    return asyncio.run(main)
