"""`raftlog topic|produce|consume`: the console tools (kafka-topics, console producer/consumer).

Bootstrap resolution, in order: `--bootstrap`, `$RAFTLOG_BOOTSTRAP`, `--dir DIR/cluster.json`,
then `./cluster.json`. Errors are one line on stderr with a non-zero exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raftlog.errors import RaftlogError

if TYPE_CHECKING:
    from raftlog.client.admin import TopicDescription

__all__ = [
    "UsageError",
    "add_client_parsers",
    "add_common_options",
    "guarded",
    "resolve_bootstrap",
    "security_options",
]


class UsageError(Exception):
    """Bad command-line input; exit code 2."""


def resolve_bootstrap(flag: str | None, directory: Path | None = None) -> str:
    if flag:
        return flag
    env = os.environ.get("RAFTLOG_BOOTSTRAP")
    if env:
        return env
    for candidate in ([directory / "cluster.json"] if directory else []) + [Path("cluster.json")]:
        if candidate.exists():
            bootstrap = json.loads(candidate.read_text()).get("bootstrap")
            if bootstrap:
                return str(bootstrap)
    raise UsageError(
        "no bootstrap address: pass --bootstrap HOST:PORT[,...], set RAFTLOG_BOOTSTRAP, "
        "or run where cluster.json is (raftlog cluster up writes it)"
    )


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", help="HOST:PORT[,HOST:PORT...] of any nodes")
    parser.add_argument("--dir", type=Path, help="a local cluster's directory (cluster.json)")
    # Security settings (docs/security.md).
    parser.add_argument("--tls-ca", type=Path, help="connect over TLS, trusting this PEM CA")
    parser.add_argument("--token", help="bearer token (default: $RAFTLOG_TOKEN)")
    parser.add_argument("--tls-cert", type=Path, help="PEM client certificate (mutual TLS)")
    parser.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")


def security_options(args: argparse.Namespace) -> dict[str, object]:
    """Keyword options for Admin/Producer/Consumer: TLS CA, client certificate and token
    (flag, then env)."""
    token = args.token or os.environ.get("RAFTLOG_TOKEN") or None
    return {
        "tls_ca": args.tls_ca,
        "token": token,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
    }


def leaders_offsets(
    bootstrap: str, options: dict[str, Any], topic: TopicDescription
) -> dict[int, tuple[str, str]]:
    """Each partition's (log start offset, high watermark) as its leader knows them, for
    display ("unknown" when no leader answers). The node that answered `describe` knows
    only the partitions it leads."""
    from raftlog.client import Consumer
    from raftlog.client.errors import ClientError

    shown = {
        p.id: (str(p.log_start_offset), str(p.high_watermark))
        for p in topic.partitions
        if p.high_watermark >= 0
    }
    missing = [p.id for p in topic.partitions if p.id not in shown]
    if not missing:
        return shown
    consumer = Consumer(bootstrap, request_timeout_ms=5_000, **options)
    try:
        for partition in missing:
            tp = (topic.name, partition)
            try:
                start = next(iter(consumer.beginning_offsets([tp]).values()))
                end = next(iter(consumer.end_offsets([tp]).values()))
                shown[partition] = (str(start), str(end))
            except ClientError:
                shown[partition] = ("unknown", "unknown")
    finally:
        consumer.close()
    return shown


def add_client_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topic = subparsers.add_parser("topic", help="create, list, describe, alter or delete topics")
    actions = topic.add_subparsers(dest="topic_command", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--replication-factor", type=int, default=3)
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    for action in (create, *(actions.add_parser(a, help=f"{a} topics") for a in ("list",))):
        add_common_options(action)
    describe = actions.add_parser(
        "describe", help="partitions, leaders, replicas, log starts, watermarks"
    )
    describe.add_argument("name")
    delete = actions.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name")
    alter = actions.add_parser("alter", help="set or remove topic configs (cleanup.policy, ...)")
    alter.add_argument("name")
    alter.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    alter.add_argument("--delete-config", action="append", default=[], metavar="KEY")
    delete_records = actions.add_parser(
        "delete-records",
        help="delete a partition's records below an offset (kafka-delete-records.sh)",
    )
    delete_records.add_argument("name")
    delete_records.add_argument("--partition", type=int, required=True)
    delete_records.add_argument(
        "--offset", type=int, required=True, help="the new log start offset; -1: the end"
    )
    for action in (describe, delete, alter, delete_records):
        add_common_options(action)
    topic.set_defaults(func=guarded(_topic))

    produce = subparsers.add_parser("produce", help="send each line of stdin as a record")
    produce.add_argument("topic")
    produce.add_argument("--acks", choices=("0", "1", "all"), default="all")
    produce.add_argument("--key", help="the key of every record (default: none)")
    produce.add_argument("--partition", type=int)
    add_common_options(produce)
    produce.set_defaults(func=guarded(_produce))

    consume = subparsers.add_parser("consume", help="print committed records")
    consume.add_argument("topic")
    consume.add_argument("--partition", type=int, help="one partition (default: all)")
    consume.add_argument("--from", dest="start", default="earliest", help="earliest|latest|OFFSET")
    consume.add_argument("--max-records", type=int)
    consume.add_argument("--timeout-ms", type=int, default=3000, help="stop after this idle time")
    consume.add_argument("--format", choices=("value", "json"), default="value")
    consume.add_argument(
        "--isolation-level",
        choices=("read_uncommitted", "read_committed"),
        default="read_uncommitted",
        help="read_committed: only committed transactions, up to the last stable offset "
        "(as kafka-console-consumer's option; default read_uncommitted, as there)",
    )
    add_common_options(consume)
    consume.set_defaults(func=guarded(_consume))


def guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            result: int = command(args)
            return result
        except UsageError as error:
            print(f"raftlog {args.command}: {error}", file=sys.stderr)
            return 2
        except (RaftlogError, TimeoutError, OSError) as error:
            print(f"raftlog {args.command}: {error}", file=sys.stderr)
            return 1
        except Exception as error:
            print(f"raftlog {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
            return 1

    return run


def _parse_configs(items: list[str]) -> dict[str, str]:
    configs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--config: expected KEY=VALUE, got {item!r}")
        configs[key] = value
    return configs


def _topic(args: argparse.Namespace) -> int:
    from raftlog.client import Admin

    admin = Admin(resolve_bootstrap(args.bootstrap, args.dir), **security_options(args))  # type: ignore[arg-type]
    try:
        if args.topic_command == "create":
            admin.create_topic(
                args.name,
                partitions=args.partitions,
                replication_factor=args.replication_factor,
                config=_parse_configs(args.config) or None,
            )
            print(f"created topic {args.name}")
        elif args.topic_command == "list":
            for name in admin.list_topics():
                print(name)
        elif args.topic_command == "describe":
            topic = admin.describe_topic(args.name)
            print(f"topic {topic.name} id {topic.topic_id} replication {topic.replication_factor}")
            for key, value in sorted(topic.config.items()):
                print(f"  config {key}={value}")
            offsets = leaders_offsets(
                resolve_bootstrap(args.bootstrap, args.dir), security_options(args), topic
            )
            for p in topic.partitions:
                start, high_watermark = offsets[p.id]
                print(
                    f"  partition {p.id}: leader {p.leader} epoch {p.epoch} "
                    f"replicas {list(p.replicas)} log start {start} high watermark "
                    f"{high_watermark}"
                )
        elif args.topic_command == "alter":
            topic = admin.alter_topic_config(
                args.name,
                set_config=_parse_configs(args.config),
                delete_keys=args.delete_config,
            )
            shown = " ".join(f"{k}={v}" for k, v in sorted(topic.config.items()))
            print(f"altered topic {args.name}: {shown or '(defaults)'}")
        elif args.topic_command == "delete-records":
            low = admin.delete_records(args.name, {args.partition: args.offset})[args.partition]
            print(f"topic {args.name} partition {args.partition}: log start offset {low}")
        else:
            admin.delete_topic(args.name)
            print(f"deleted topic {args.name}")
    finally:
        admin.close()
    return 0


def _produce(args: argparse.Namespace) -> int:
    from raftlog.client import Producer

    acks: int | str = "all" if args.acks == "all" else int(args.acks)
    key = args.key.encode() if args.key is not None else None
    futures = []
    bootstrap = resolve_bootstrap(args.bootstrap, args.dir)
    # Idempotence needs acks=all (as in Kafka); the weaker acks send without it.
    security = security_options(args)
    with Producer(bootstrap, acks=acks, enable_idempotence=acks == "all", **security) as producer:  # type: ignore[arg-type]
        for line in sys.stdin.buffer:
            value = line.rstrip(b"\n")
            futures.append(
                producer.send(args.topic, value=value, key=key, partition=args.partition)
            )
        producer.flush()
        for future in futures:
            future.result(timeout=60)
    print(f"produced {len(futures)} records", file=sys.stderr)
    return 0


def _consume(args: argparse.Namespace) -> int:
    from raftlog.client import Consumer

    consumer = Consumer(
        resolve_bootstrap(args.bootstrap, args.dir),
        isolation_level=args.isolation_level,
        **security_options(args),  # type: ignore[arg-type]
    )
    try:
        partitions = (
            [args.partition]
            if args.partition is not None
            else sorted(consumer.partitions_for_topic(args.topic))
        )
        tps = [(args.topic, p) for p in partitions]
        consumer.assign(tps)
        _seek(consumer, tps, args.start)
        return _print_records(consumer, args)
    finally:
        consumer.close()


def _seek(consumer: object, tps: list[tuple[str, int]], start: str) -> None:
    if start == "earliest":
        consumer.seek_to_beginning(*tps)  # type: ignore[attr-defined]
    elif start == "latest":
        consumer.seek_to_end(*tps)  # type: ignore[attr-defined]
    elif start.isdigit():
        for tp in tps:
            consumer.seek(tp, int(start))  # type: ignore[attr-defined]
    else:
        raise UsageError(f"--from: expected earliest, latest or an offset, got {start!r}")


def _print_records(consumer: object, args: argparse.Namespace) -> int:
    printed = 0
    idle_deadline = time.monotonic() + args.timeout_ms / 1000
    while time.monotonic() < idle_deadline:
        records = consumer.poll(timeout_ms=200)  # type: ignore[attr-defined]
        if records:
            idle_deadline = time.monotonic() + args.timeout_ms / 1000
        for record in records:
            if args.format == "json":
                print(
                    json.dumps(
                        {
                            "topic": record.topic,
                            "partition": record.partition,
                            "offset": record.offset,
                            "timestamp_ms": record.timestamp_ms,
                            "key": None
                            if record.key is None
                            else record.key.decode(errors="replace"),
                            "value": None
                            if record.value is None
                            else record.value.decode(errors="replace"),
                        }
                    )
                )
            else:
                sys.stdout.buffer.write((record.value or b"") + b"\n")
            printed += 1
            if args.max_records is not None and printed >= args.max_records:
                sys.stdout.flush()
                return 0
    sys.stdout.flush()
    return 0
