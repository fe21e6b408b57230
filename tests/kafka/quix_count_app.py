"""A Quix Streams worker (test_quix_exactly_once.py runs it as a subprocess with .venv-quix's
python): counts the words of topic `quix-words` in its state (a rocksdb store backed by a
changelog topic that Quix creates) and sends each word's new count to `quix-counts`, exactly
once: the output records, the changelog records and the input offsets commit in one Kafka
transaction.

    QUIX_BROKER=host:port QUIX_STATE_DIR=DIR QUIX_TRANSACTIONAL_ID=ID \\
        [QUIX_STALL_AT_OFFSET=N] python tests/kafka/quix_count_app.py

QUIX_STALL_AT_OFFSET makes the worker stop for good when it reaches that input offset, with
the words counted since its last commit sent in its open transaction: where the test kills
it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from quixstreams import Application, State, message_context
from quixstreams.exceptions.assignment import PartitionAssignmentError

CONSUMER_GROUP = "raftlog-quix-count"
INPUT_TOPIC = "quix-words"
OUTPUT_TOPIC = "quix-counts"
# A commit every COMMIT_EVERY input records and no other (the interval is longer than any
# run), so the test knows where the transactions end.
COMMIT_EVERY = 50
COMMIT_INTERVAL_S = 3600.0
STALL_AT_OFFSET = int(os.environ.get("QUIX_STALL_AT_OFFSET", "-1"))
# raftlog elects a new partition's first leader by a Raft election and, when a replica other
# than the preferred one (the first listed) wins it, hands leadership to the preferred one a
# moment later; Quix creates its changelog topic just before the consumer's first assignment.
# It asks for the changelog's watermarks once when a partition is assigned (librdkafka's
# query_watermark_offsets, which does not retry NOT_LEADER_FOR_PARTITION) and stops the
# application on that error, where a supervisor would start the worker again: so does this
# loop, for that error only, with a new Application (and the same transactional.id).
RESTARTS_MAX = 5


def count(word: str, state: State[str, int]) -> dict[str, Any]:
    if message_context().offset == STALL_AT_OFFSET:
        print(f"stalled at input offset {STALL_AT_OFFSET}", flush=True)
        time.sleep(3600)  # killed here by the test
    total: int = state.get("count", 0) + 1
    state.set("count", total)
    return {"word": word, "count": total}


def run() -> None:
    app = Application(
        broker_address=os.environ["QUIX_BROKER"],
        consumer_group=CONSUMER_GROUP,
        processing_guarantee="exactly-once",
        auto_offset_reset="earliest",
        state_dir=os.environ["QUIX_STATE_DIR"],
        commit_every=COMMIT_EVERY,
        commit_interval=COMMIT_INTERVAL_S,
        # The killed worker's membership ends when its session does; the replacement's join
        # waits for that, not for librdkafka's default of 45 s.
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
        # Quix draws a random transactional.id per process, so a killed worker's open
        # transaction would stay open (holding back read_committed readers of the output)
        # until transaction.timeout.ms. A worker that replaces another with the same id
        # fences it and aborts that transaction when it starts, as a deployment with one
        # stable id per worker slot does.
        producer_extra_config={"transactional.id": os.environ["QUIX_TRANSACTIONAL_ID"]},
    )
    words = app.topic(INPUT_TOPIC, key_deserializer="str", value_deserializer="str")
    counts = app.topic(OUTPUT_TOPIC, key_serializer="str", value_serializer="json")
    app.dataframe(words).apply(count, stateful=True).to_topic(counts)
    app.run()


def _leader_moved(error: PartitionAssignmentError) -> bool:
    cause = error.__cause__
    return (
        isinstance(cause, KafkaException)
        and cause.args[0].code() == KafkaError.NOT_LEADER_FOR_PARTITION
    )


def main() -> None:
    for _ in range(RESTARTS_MAX):
        try:
            run()
            return
        except PartitionAssignmentError as error:
            if not _leader_moved(error):
                raise
            print(f"restarting: the partition assignment failed: {error.__cause__}", flush=True)
    run()


if __name__ == "__main__":
    main()
