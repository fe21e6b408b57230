"""Consumer groups on real node processes (issue 6): members share partitions, partitions move
incrementally as members join and die, every record is consumed, committed offsets survive a
consumer restart and a controller kill.

The nodes run with a 3 s group session timeout and 300 ms heartbeats so expiry is quick.
Records carry "<partition>:<sequence>" values so a consumer's stream per partition can be
checked for gaps independently of control batches (which occupy offsets).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest

from raftlog.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition
from raftlog.local_cluster import LocalCluster
from tests.integration.conftest import start_cluster, wait_until

SESSION_MS = 3000
GROUP_FLAGS = (
    "--set",
    f"metadata.group_session_timeout_ms={SESSION_MS}",
    "--set",
    "metadata.group_heartbeat_interval_ms=300",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("groups"), 3, *GROUP_FLAGS)
    yield cluster
    cluster.stop()


def consumer(cluster: LocalCluster, group: str, **options: object) -> Consumer:
    settings: dict[str, object] = {
        "group_id": group,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": 100,
        "auto_commit_interval_ms": 500,
        "max_poll_records": 20,
    }
    settings.update(options)
    return Consumer(cluster.bootstrap, **settings)  # type: ignore[arg-type]


class Tracker:
    """What each consumer got, per partition, and every assignment it held at once."""

    def __init__(self) -> None:
        self.values: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        self.assignments: dict[str, list[set[TopicPartition]]] = defaultdict(list)
        # Recorded, not raised: wait_until() retries a condition that raises.
        self.violations: list[str] = []

    def poll(self, name: str, member: Consumer, timeout_ms: int = 100) -> list[ConsumerRecord]:
        records = member.poll(timeout_ms=timeout_ms)
        for record in records:
            assert record.value is not None
            partition, sequence = map(int, record.value.split(b":"))
            assert partition == record.partition
            self.values[name][partition].append(sequence)
        self.assignments[name].append(member.assignment())
        return records

    def consumed(self) -> set[tuple[int, int]]:
        return {(p, s) for per in self.values.values() for p, seqs in per.items() for s in seqs}

    def check_disjoint(self, members: dict[str, Consumer]) -> None:
        seen: dict[TopicPartition, str] = {}
        for name, member in members.items():
            for tp in member.assignment():
                if tp in seen:
                    self.violations.append(f"{tp} held by {seen[tp]} and {name} at once")
                seen[tp] = name


class SteadyProducer:
    """Produces "<partition>:<sequence>" to every partition in turn until stopped."""

    def __init__(self, cluster: LocalCluster, topic: str, partitions: int) -> None:
        self.producer = Producer(cluster.bootstrap, acks="all", linger_ms=2)
        self.topic, self.partitions = topic, partitions
        self.sent: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-producer")

    def _run(self) -> None:
        sequence = 0
        while not self._stop.is_set():
            for partition in range(self.partitions):
                value = f"{partition}:{sequence}".encode()
                self.producer.send(self.topic, value=value, partition=partition).result(timeout=30)
                self.sent.add((partition, sequence))
            sequence += 1
            self._stop.wait(0.02)

    def __enter__(self) -> SteadyProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.producer.close()


def test_members_share_partitions_move_incrementally_and_a_dead_member_is_replaced(
    cluster: LocalCluster,
) -> None:
    Admin(cluster.bootstrap).create_topic("events", partitions=6, replication_factor=3)
    tracker = Tracker()
    c1, c2 = consumer(cluster, "readers"), consumer(cluster, "readers")
    members = {"c1": c1, "c2": c2}
    for member in members.values():
        member.subscribe(["events"])
    with SteadyProducer(cluster, "events", 6) as producer:

        def poll_all() -> None:
            for name, member in members.items():
                tracker.poll(name, member)
            tracker.check_disjoint(members)

        def split(*names: str) -> bool:
            poll_all()
            sizes = [len(members[n].assignment()) for n in names]
            return sum(sizes) == 6 and max(sizes) - min(sizes) <= 1

        wait_until(lambda: split("c1", "c2"), timeout_s=30, what="c1 and c2 to split 6 partitions")
        before = {name: set(m.assignment()) for name, m in members.items()}
        marks = {name: len(tracker.assignments[name]) for name in members}

        # A third member joins: each of the first two gives up one partition, keeps two.
        c3 = consumer(cluster, "readers")
        members["c3"] = c3
        c3.subscribe(["events"])
        wait_until(lambda: split("c1", "c2", "c3"), timeout_s=30, what="three members of two")
        for name in ("c1", "c2"):
            kept = before[name] & members[name].assignment()
            assert len(kept) == 2, (name, before[name], members[name].assignment())
            held = tracker.assignments[name][marks[name] :]
            assert all(kept <= snapshot for snapshot in held), "a kept partition was paused"
            for tp in kept:
                sequences = tracker.values[name][tp.partition]
                assert sequences == list(range(len(sequences))), f"{name} {tp}: a gap"

        # c2 dies (stops heartbeating without leaving): its partitions move after the session.
        dead = set(c2.assignment())
        del members["c2"]
        started = time.monotonic()
        wait_until(
            lambda: split("c1", "c3") and dead <= c1.assignment() | c3.assignment(),
            timeout_s=30,
            what="c2's partitions to move to c1 and c3",
        )
        moved_after_s = time.monotonic() - started
        assert moved_after_s >= SESSION_MS / 1000 * 0.8, moved_after_s

    sent = producer.sent
    wait_until(
        lambda: (poll_all(), sent <= tracker.consumed())[1],
        timeout_s=60,
        what="every produced record to be consumed",
    )
    assert tracker.violations == []
    for member in (c1, c3):
        member.close()
    c2.close()


def _consume(member: Consumer, count: int) -> list[ConsumerRecord]:
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + 30
    while len(records) < count and time.monotonic() < deadline:
        records += member.poll(timeout_ms=200, max_records=count - len(records))
    assert len(records) == count, f"got {len(records)} of {count} records"
    return records


def _produce(cluster: LocalCluster, topic: str, partitions: int, per_partition: int) -> None:
    with Producer(cluster.bootstrap, acks="all") as producer:
        for sequence in range(per_partition):
            for partition in range(partitions):
                value = f"{partition}:{sequence}".encode()
                producer.send(topic, value=value, partition=partition)
        producer.flush()


def test_a_restarted_consumer_resumes_from_the_committed_offsets(cluster: LocalCluster) -> None:
    Admin(cluster.bootstrap).create_topic("resume", partitions=3, replication_factor=3)
    _produce(cluster, "resume", 3, 20)
    first = consumer(cluster, "resumers", enable_auto_commit=False)
    first.subscribe(["resume"])
    taken = _consume(first, 30)
    first.commit()
    committed = {tp: first.committed(tp) for tp in sorted(first.assignment())}
    first.close()
    assert all(offset is not None for offset in committed.values())

    second = consumer(cluster, "resumers")
    second.subscribe(["resume"])
    rest = _consume(second, 30)
    for record in rest:
        offset = committed[TopicPartition(record.topic, record.partition)]
        assert offset is not None and record.offset >= offset, "re-read below the commit"
    values = sorted(r.value for r in taken + rest if r.value is not None)
    expected = sorted(f"{p}:{s}".encode() for p in range(3) for s in range(20))
    assert values == expected, "every record exactly once across the restart"
    second.close()


def test_committed_offsets_survive_a_controller_kill(cluster: LocalCluster) -> None:
    admin = Admin(cluster.bootstrap)
    admin.create_topic("durable", partitions=2, replication_factor=3)
    _produce(cluster, "durable", 2, 10)
    standalone = consumer(cluster, "keepers")
    standalone.assign([("durable", 0), ("durable", 1)])
    standalone.commit({("durable", 0): 4, ("durable", 1): 7})
    standalone.close()

    controller = admin.describe_cluster().controller_id
    assert controller is not None
    cluster.kill_node(controller, sig=signal.SIGKILL)
    try:
        survivors = ",".join(
            n.client_address for n in cluster.nodes.values() if n.node_id != controller
        )
        reader = Consumer(survivors, group_id="keepers", auto_offset_reset="earliest")
        wait_until(
            lambda: admin.describe_cluster().controller_id not in (None, controller),
            timeout_s=30,
            what="a new controller",
        )
        assert reader.committed(("durable", 0)) == 4
        assert reader.committed(("durable", 1)) == 7
        reader.subscribe(["durable"])
        lowest: dict[int, int] = {}

        def both_partitions_read() -> bool:
            for record in reader.poll(timeout_ms=200):
                lowest[record.partition] = min(record.offset, lowest.get(record.partition, 1 << 62))
            return set(lowest) == {0, 1}

        wait_until(both_partitions_read, timeout_s=30, what="records of both partitions")
        # From "earliest" the first records sit at offset 1; resuming starts at the commit.
        assert lowest[0] >= 4 and lowest[1] >= 7, lowest
        assert lowest[0] <= 5 and lowest[1] <= 8, f"records skipped after the commit: {lowest}"
        reader.close()
    finally:
        cluster.start_node(controller, *GROUP_FLAGS)
