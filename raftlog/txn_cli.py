"""`raftlog txn list|describe|abort`: transactions for operators (Kafka's kafka-transactions.sh).

    raftlog txn list [--state Ongoing ...]     every transactional id: producer, state, age
    raftlog txn describe ID                    one id: partitions and groups of its transaction
    raftlog txn abort ID                       abort a hanging transaction, fencing its producer

`abort` goes through the coordinator (the controller), which decides the abort as it does for
a transaction past its timeout and answers once the ABORT markers are written, so
read_committed consumers move past the transaction when it returns (docs/transactions.md).
The bootstrap and security options are those of `raftlog topic`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING

from raftlog.client_cli import add_common_options, guarded, resolve_bootstrap, security_options

if TYPE_CHECKING:
    from raftlog.client.admin import TransactionDescription

__all__ = ["add_txn_parser"]


def add_txn_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    txn = subparsers.add_parser("txn", help="list, describe or abort transactions")
    actions = txn.add_subparsers(dest="txn_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="transactional ids: producer, state, age")
    listing.add_argument(
        "--state", action="append", default=[], help="only ids in this state (repeatable)"
    )
    describe = actions.add_parser("describe", help="one transactional id and its transaction")
    describe.add_argument("transactional_id")
    abort = actions.add_parser("abort", help="abort an open transaction, fencing its producer")
    abort.add_argument("transactional_id")
    for action in (listing, describe, abort):
        action.add_argument("--format", choices=("table", "json"), default="table")
        add_common_options(action)
    txn.set_defaults(func=guarded(_txn))


def _txn(args: argparse.Namespace) -> int:
    from raftlog.client import Admin

    bootstrap = resolve_bootstrap(args.bootstrap, args.dir)
    with Admin(bootstrap, **security_options(args)) as admin:  # type: ignore[arg-type]
        if args.txn_command == "list":
            _print_list(admin.list_transactions(args.state), args.format)
        elif args.txn_command == "describe":
            _print_one(admin.describe_transaction(args.transactional_id), args.format)
        else:
            aborted = admin.abort_transaction(args.transactional_id)
            if args.format == "json":
                print(json.dumps(None if aborted is None else dataclasses.asdict(aborted)))
            else:
                epoch = "" if aborted is None else f" (producer epoch now {aborted.producer_epoch})"
                print(f"aborted the transaction of {args.transactional_id}{epoch}")
    return 0


def _age(txn: TransactionDescription) -> str:
    return "-" if txn.age_ms < 0 else f"{txn.age_ms}ms"


def _print_list(txns: list[TransactionDescription], output: str) -> None:
    if output == "json":
        print(json.dumps([dataclasses.asdict(t) for t in txns]))
        return
    rows = [("TRANSACTIONAL_ID", "PRODUCER_ID", "EPOCH", "STATE", "COORDINATOR", "AGE")]
    rows += [
        (
            t.transactional_id,
            str(t.producer_id),
            str(t.producer_epoch),
            t.state,
            "-" if t.coordinator_id is None else str(t.coordinator_id),
            _age(t),
        )
        for t in txns
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def _print_one(txn: TransactionDescription, output: str) -> None:
    if output == "json":
        print(json.dumps(dataclasses.asdict(txn)))
        return
    coordinator = "-" if txn.coordinator_id is None else txn.coordinator_id
    print(f"transactional id {txn.transactional_id}")
    print(f"  producer id {txn.producer_id} epoch {txn.producer_epoch}")
    print(f"  state {txn.state}  coordinator {coordinator}")
    print(f"  timeout {txn.timeout_ms}ms  start time {txn.start_time_ms}  age {_age(txn)}")
    for topic, partition in txn.partitions:
        print(f"  partition {topic}-{partition}")
    for group in txn.groups:
        print(f"  group {group}")
