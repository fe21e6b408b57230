"""Quix Streams' exactly-once mode (confluent-kafka's transactional producer, KIP-447 offsets
and read_committed consumers underneath) against raftlog: a worker process counting words in
its state (tests/kafka/quix_count_app.py: a rocksdb store with its changelog topic) and
sending each word's new count to an output topic is killed with SIGKILL while its
transaction holds counts it already sent; a replacement with an empty state directory (so it
rebuilds the counts from the changelog) takes over, and the output, read with
read_committed, holds for each word the counts 1, 2, ..., n in order, once each: none of the
killed worker's open transaction (aborted when the replacement took over its transactional
id) is visible, none committed is lost, and the replacement went on from exactly the
committed input offset with exactly the committed state.

Quix Streams requires a confluent-kafka older than the [dev] venv's, so the worker runs with
the python of its own venv, .venv-quix (`make install-quix`, which the test runs itself);
the results are read here with this venv's confluent-kafka."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic
from tests.kafka.worker_process import spawn_worker

kafka = pytest.importorskip("confluent_kafka")

ROOT = pathlib.Path(__file__).parents[2]
APP = pathlib.Path(__file__).with_name("quix_count_app.py")
QUIX_PYTHON = ROOT / ".venv-quix" / "bin" / "python"
INPUT_TOPIC = "quix-words"
OUTPUT_TOPIC = "quix-counts"
TRANSACTIONAL_ID = "raftlog-quix-count-0"
WORDS = ("raft", "log", "term", "vote", "epoch", "offset", "leader")
WORD_COUNT = 1000
# The first worker stops for good at this input offset, between two of its commits (one every
# 50 input records): the counts of offsets 250..298 are sent in its open transaction.
STALL_AT_OFFSET = 299
PROGRESS_TIMEOUT_S = 60.0


def _index_reachable() -> tuple[str, bool]:
    url = urllib.parse.urlsplit(os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple"))
    host = url.hostname or "pypi.org"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=10).close()
    except OSError:
        return host, False
    return host, True


@pytest.fixture(scope="module")
def quix_python() -> pathlib.Path:
    """.venv-quix's python, the venv built (or brought up to date) by `make install-quix`."""
    built = subprocess.run(
        ["make", "-s", "install-quix"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if built.returncode != 0:
        host, reachable = _index_reachable()
        if not reachable:
            pytest.skip(
                f"cannot build .venv-quix for Quix Streams: the package index {host} is unreachable"
            )
        pytest.fail(f"make install-quix failed:\n{built.stdout[-3000:]}{built.stderr[-3000:]}")
    return QUIX_PYTHON


class Worker:
    """One process of the count app, its output kept in a log file."""

    def __init__(
        self, python: pathlib.Path, boot: str, work: pathlib.Path, name: str, stall_at: int
    ) -> None:
        self.log = work / f"{name}.log"
        env = dict(
            os.environ,
            QUIX_BROKER=boot,
            QUIX_STATE_DIR=str(work / f"{name}-state"),
            QUIX_TRANSACTIONAL_ID=TRANSACTIONAL_ID,
            QUIX_STALL_AT_OFFSET=str(stall_at),
        )
        self.process = spawn_worker([str(python), str(APP)], cwd=work, env=env, log=self.log)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


class OutputReader:
    """The (word, count) records a consumer with `isolation` sees of the output topic from its
    start."""

    def __init__(self, boot: str, isolation: str) -> None:
        self.consumer = kafka.Consumer(
            {
                "bootstrap.servers": boot,
                "group.id": f"quix-check-{isolation}",
                "isolation.level": isolation,
                "enable.auto.commit": False,
            }
        )
        self.consumer.assign([kafka.TopicPartition(OUTPUT_TOPIC, 0, kafka.OFFSET_BEGINNING)])
        self.records: list[tuple[str, int]] = []
        self.last_offset = -1

    def poll(self) -> None:
        for message in self.consumer.consume(500, 0.2):
            if message.error() is None:
                value = json.loads(message.value())
                assert value["word"] == message.key().decode()
                self.records.append((value["word"], value["count"]))
                self.last_offset = message.offset()

    def close(self) -> None:
        self.consumer.close()


def _feed(boot: str, words: list[str]) -> None:
    producer = kafka.Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5})
    for word in words:
        producer.produce(INPUT_TOPIC, key=word.encode(), value=word.encode(), partition=0)
    assert producer.flush(30) == 0


def _wait_records(reader: OutputReader, count: int, worker: Worker) -> None:
    # A bound on the time without progress, not on the whole: a loaded machine is slow.
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    seen = len(reader.records)
    while len(reader.records) < count:
        if worker.process.poll() is not None:
            pytest.fail(f"the worker exited {worker.process.returncode}:\n{worker.tail()}")
        if len(reader.records) > seen:
            seen = len(reader.records)
            deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        if time.monotonic() > deadline:
            pytest.fail(f"{seen} of {count} output records read:\n{worker.tail()}")
        reader.poll()


def _wait_offset(reader: OutputReader, offset: int, worker: Worker) -> None:
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while reader.last_offset < offset:
        if time.monotonic() > deadline:
            pytest.fail(f"read up to offset {reader.last_offset} of {offset}:\n{worker.tail()}")
        reader.poll()


@pytest.fixture
def words(kafka_cluster: LocalCluster) -> Iterator[list[str]]:
    # Quix creates its state's changelog topic itself.
    create_topic(kafka_cluster, INPUT_TOPIC, partitions=1)
    create_topic(kafka_cluster, OUTPUT_TOPIC, partitions=1)
    rng = random.Random(31)
    yield [rng.choice(WORDS) for _ in range(WORD_COUNT)]


def test_a_killed_worker_counts_each_word_exactly_once(
    quix_python: pathlib.Path,  # first: a skip starts no cluster
    kafka_cluster: LocalCluster,
    words: list[str],
    tmp_path: pathlib.Path,
) -> None:
    boot = kafka_cluster.kafka_bootstrap
    _feed(boot, words)
    committed = OutputReader(boot, "read_committed")
    uncommitted = OutputReader(boot, "read_uncommitted")
    first = Worker(quix_python, boot, tmp_path, "worker-1", stall_at=STALL_AT_OFFSET)
    second = None
    try:
        # Killed once every count before the stall is on the broker, the last of them in its
        # open transaction.
        _wait_records(uncommitted, STALL_AT_OFFSET, first)
        first.kill()
        second = Worker(quix_python, boot, tmp_path, "worker-2", stall_at=-1)
        _wait_records(committed, len(words), second)
        committed.poll()  # anything past the exact count shows up here
        updates: dict[str, list[int]] = {}
        for word, count in committed.records:
            updates.setdefault(word, []).append(count)
        expected = Counter(words)
        assert updates == {word: list(range(1, n + 1)) for word, n in expected.items()}, (
            f"{len(committed.records)} committed output records; the second worker's log ends:"
            f"\n{second.tail()}"
        )
        # The killed worker's open transaction did hold counts, which read_committed hid: the
        # kill tested an abort, not a worker idle between transactions.
        _wait_offset(uncommitted, committed.last_offset, second)
        aborted = len(uncommitted.records) - len(committed.records)
        assert aborted > 0, "the killed worker's transaction held no output records"
    finally:
        committed.close()
        uncommitted.close()
        first.kill()
        if second is not None:
            second.kill()
