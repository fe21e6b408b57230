"""A consume-transform-produce worker for the SIGKILL tests (test_transaction_faults.py), run
as its own process so the test can kill it with SIGKILL.

    python -m tests.kafka.txn_transformer BOOT IN_TOPIC OUT_TOPIC OUT_PARTITIONS UNTIL
        [--batch N] [--stop-in-batch K]

It reads IN_TOPIC partition 0 with read_committed from its group's committed offset and, per
transaction, turns up to `--batch` records `in-<i>` into `out-<i>` (to partition i %
OUT_PARTITIONS of OUT_TOPIC) and commits the input offsets with them
(send_offsets_to_transaction), until its committed position reaches UNTIL. It prints
`committed <position>` after each commit. With `--stop-in-batch K` it stops inside its K-th
transaction (counting from 1), its output produced and acknowledged and its offsets sent but
not committed, prints `mid-transaction <position>` and waits to be killed.

Every instance has the same transactional id, so a restarted one's init_transactions fences
the killed one and aborts its open transaction (KIP-98).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import confluent_kafka as kafka

GROUP = "txn-transformer-faults"
TRANSACTIONAL_ID = "txn-transformer-faults"
POLL_S = 0.2


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    for name in ("boot", "in_topic", "out_topic"):
        parser.add_argument(name)
    parser.add_argument("out_partitions", type=int)
    parser.add_argument("until", type=int)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--stop-in-batch", type=int, default=0)
    args = parser.parse_args(argv)
    producer = kafka.Producer(
        {
            "bootstrap.servers": args.boot,
            "transactional.id": TRANSACTIONAL_ID,
            "transaction.timeout.ms": 60_000,
        }
    )
    # Before the consumer reads its committed offset: this fences an earlier instance and
    # aborts its open transaction, whose offsets must not count.
    producer.init_transactions(60)
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": args.boot,
            "group.id": GROUP,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([kafka.TopicPartition(args.in_topic, 0)])
    try:
        transform(producer, consumer, args)
    finally:
        consumer.close()
    return 0


def transform(producer: Any, consumer: Any, args: argparse.Namespace) -> None:
    position, batches = -1, 0
    while position < args.until:
        taken = take(consumer, args.batch)
        if not taken:
            continue
        batches += 1
        producer.begin_transaction()
        for message in taken:
            index = int(message.value().decode().removeprefix("in-"))
            value = f"out-{index}".encode()
            producer.produce(args.out_topic, value=value, partition=index % args.out_partitions)
        position = taken[-1].offset() + 1
        offsets = [kafka.TopicPartition(args.in_topic, 0, position)]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
        if batches == args.stop_in_batch:
            assert producer.flush(30) == 0
            print(f"mid-transaction {position}", flush=True)
            while True:
                time.sleep(1)  # until killed
        producer.commit_transaction(30)
        print(f"committed {position}", flush=True)


def take(consumer: Any, count: int) -> list[Any]:
    """Up to `count` records, fewer if none comes within a poll."""
    taken: list[Any] = []
    while len(taken) < count:
        message = consumer.poll(POLL_S)
        if message is None:
            break
        if message.error() is None:
            taken.append(message)
    return taken


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
