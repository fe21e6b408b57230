"""faust-streaming's exactly-once mode (aiokafka's transactional producer and read_committed
consumers underneath) against raftlog: a worker process counting words in a Table
(tests/kafka/faust_count_app.py) is killed with SIGKILL in the middle of its input, more words
arrive, a new worker takes over, and the counts are exact. The table's changelog, read with
read_committed, holds for each word the counts 1, 2, ..., n in order, once each: no update of
the killed worker's open transaction (aborted when the new worker took over its transactional
id) is visible, none committed is lost, and the new worker went on from exactly the committed
input offset.

(faust sends records to a topic its worker does not consume outside the transaction, so an
output topic would show the killed worker's redone work twice, on Kafka too; the changelog
and the input offsets are what its exactly-once covers.)"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic
from tests.kafka.worker_process import spawn_worker

kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("faust")

APP = pathlib.Path(__file__).with_name("faust_count_app.py")
INPUT_TOPIC = "faust-words"
CHANGELOG_TOPIC = "raftlog-count-word-counts-changelog"
WORDS = ("raft", "log", "term", "vote", "epoch", "offset", "leader")
WORD_COUNT = 1000
# faust acknowledges an input record when its agent asks for the next one, so the last word's
# offset commits only once another arrives: a last word outside the counted ones.
LAST_WORD = "~last"
PROGRESS_TIMEOUT_S = 60.0


class Worker:
    """One `faust worker` process of the count app, its output kept in a log file."""

    def __init__(self, boot: str, work: pathlib.Path, name: str) -> None:
        self.log = work / f"{name}.log"
        env = dict(os.environ, FAUST_BROKER=boot, FAUST_DATADIR=str(work / "faust-data"))
        argv = [sys.executable, str(APP), "worker", "--without-web", "--loglevel", "info"]
        self.process = spawn_worker(argv, cwd=work, env=env, log=self.log)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


class CommittedReader:
    """The table updates a read_committed consumer sees of `topic` partition 0 from the start
    (all but LAST_WORD's)."""

    def __init__(self, boot: str, topic: str) -> None:
        self.consumer = kafka.Consumer(
            {
                "bootstrap.servers": boot,
                "group.id": f"faust-check-{topic}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        self.consumer.assign([kafka.TopicPartition(topic, 0, kafka.OFFSET_BEGINNING)])
        self.records: list[tuple[bytes, bytes]] = []

    def poll(self) -> None:
        for message in self.consumer.consume(500, 0.2):
            if message.error() is None and json.loads(message.key()) != LAST_WORD:
                self.records.append((message.key(), message.value()))

    def close(self) -> None:
        self.consumer.close()


def _state(boot: str, workers: list[Worker], out: pathlib.Path) -> str:
    """Write what a failure needs to be told apart (a committed input offset whose update is not
    in the changelog, an open transaction holding the LSO back, a record missing altogether) to
    `out`: the input's end and the group's committed offset, the changelog's end at each
    isolation level and its records with their offsets, the workers' logs (each counted offset).
    Returns where it went."""
    lines = []
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = kafka.Consumer(
            {
                "bootstrap.servers": boot,
                "group.id": "raftlog-count",  # only read: never joins the group
                "isolation.level": isolation,
                "enable.auto.commit": False,
            }
        )
        try:
            for topic in (INPUT_TOPIC, CHANGELOG_TOPIC):
                ends = consumer.get_watermark_offsets(kafka.TopicPartition(topic, 0), 10, False)
                lines.append(f"{isolation} {topic} offsets (start, end): {ends}")
            (committed,) = consumer.committed([kafka.TopicPartition(INPUT_TOPIC, 0)], 10)
            lines.append(f"{isolation} group raftlog-count committed: {committed.offset}")
            consumer.assign([kafka.TopicPartition(CHANGELOG_TOPIC, 0, kafka.OFFSET_BEGINNING)])
            while messages := consumer.consume(500, 2.0):
                lines.extend(
                    f"{isolation} changelog {m.offset()}: {m.key()!r}={m.value()!r}"
                    for m in messages
                    if m.error() is None
                )
        finally:
            consumer.close()
    for worker in workers:
        lines.append(f"{worker.log.name}:\n{worker.log.read_text(errors='replace')}")
    out.write_text("\n".join(lines) + "\n")
    return f"(the changelog, offsets and worker logs are in {out})"


def _feed(boot: str, words: list[str]) -> None:
    producer = kafka.Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5})
    for word in words:
        producer.produce(INPUT_TOPIC, key=word.encode(), value=word.encode(), partition=0)
    assert producer.flush(30) == 0


def _wait_updates(
    reader: CommittedReader, count: int, worker: Worker, state: Callable[[], str]
) -> None:
    # A bound on the time without progress, not on the whole: a loaded machine is slow.
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    seen = len(reader.records)
    while len(reader.records) < count:
        if worker.process.poll() is not None:
            code = worker.process.returncode
            pytest.fail(f"the worker exited {code} {state()}:\n{worker.tail()}")
        if len(reader.records) > seen:
            seen = len(reader.records)
            deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        if time.monotonic() > deadline:
            committed = len(reader.records)
            pytest.fail(f"{committed} of {count} table updates committed {state()}")
        reader.poll()


@pytest.fixture
def words(kafka_cluster: LocalCluster) -> Iterator[list[str]]:
    create_topic(kafka_cluster, INPUT_TOPIC, partitions=1)  # faust makes its changelog itself
    rng = random.Random(30)
    yield [rng.choice(WORDS) for _ in range(WORD_COUNT)]


def test_a_killed_worker_counts_each_word_exactly_once(
    kafka_cluster: LocalCluster, words: list[str], tmp_path: pathlib.Path
) -> None:
    boot = kafka_cluster.kafka_bootstrap
    half = len(words) // 2
    _feed(boot, words[:half])
    first = Worker(boot, tmp_path, "worker-1")
    second = None
    reader = CommittedReader(boot, CHANGELOG_TOPIC)

    def state() -> str:
        workers = [first] if second is None else [first, second]
        return _state(boot, workers, tmp_path / "state.txt")

    try:
        # Killed once a quarter of the words are counted and committed (half are there to
        # count, so it is usually mid-transaction); the rest arrive while no worker runs.
        _wait_updates(reader, len(words) // 4, first, state)
        first.kill()
        _feed(boot, [*words[half:], LAST_WORD])
        second = Worker(boot, tmp_path, "worker-2")
        _wait_updates(reader, len(words), second, state)
        reader.poll()  # anything past the exact count shows up here
        updates: dict[str, list[int]] = {}
        for key, value in reader.records:
            updates.setdefault(json.loads(key), []).append(json.loads(value))
        expected = Counter(words)
        assert updates == {word: list(range(1, n + 1)) for word, n in expected.items()}, (
            f"{len(reader.records)} changelog records {state()}"
        )
    finally:
        reader.close()
        first.stop()
        if second is not None:
            second.stop()
