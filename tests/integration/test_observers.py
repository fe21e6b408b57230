"""Observers and automatic rebalancing on real node processes (issue 5).

A node outside `--peers` registers through `--bootstrap`, follows the metadata quorum as a
learner (it answers metadata requests from its copy, hosts partition replicas, rejoins after
a restart) and never votes in it. The controller moves replicas onto a node that joined or
came back, one move at a time, once it has been alive for `metadata.rebalance_grace_ms`.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from raftlog.client import Admin, Consumer, Producer
from raftlog.client.errors import ClientError
from raftlog.local_cluster import LocalCluster, NodeProcess
from tests.integration._wait import wait_listed
from tests.integration.conftest import start_cluster, wait_until

# A short grace keeps the test quick; the default (30 s) is what production runs with.
FAST_REBALANCE = ("--set", "metadata.rebalance_grace_ms=2000")


def _voters(cluster: LocalCluster, *, excluding: tuple[int, ...] = ()) -> str:
    return ",".join(
        n.client_address
        for n in cluster.nodes.values()
        if not n.observer and n.node_id not in excluding
    )


def _alive_nodes(admin: Admin) -> set[int]:
    return {n.node_id for n in admin.describe_cluster().nodes if n.alive}


def _replica_counts(admin: Admin, *topics: str) -> Counter[int]:
    counts: Counter[int] = Counter()
    for topic in topics:
        for p in admin.describe_topic(topic).partitions:
            counts.update(p.replicas)
    return counts


def _produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> None:
    with Producer(bootstrap, acks="all") as producer:
        futures = [producer.send(topic, value=v, partition=partition) for v in values]
        for future in futures:
            future.result(timeout=60)


def _consume_all(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, partition)])
        consumer.seek_to_beginning((topic, partition))
        end_offset = next(iter(consumer.end_offsets([(topic, partition)]).values()))
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while consumer.position((topic, partition)) < end_offset and time.monotonic() < deadline:
            values += [r.value or b"" for r in consumer.poll(timeout_ms=1000)]
        return values
    finally:
        consumer.close()


def _create_or_exists(admin: Admin, topic: str) -> bool:
    """Create `topic` (one attempt); True once it exists (an attempt that timed out may
    still have been committed)."""
    with contextlib.suppress(ClientError):
        admin.create_topic(topic, partitions=1, replication_factor=1)
    return topic in admin.list_topics()


def _start_observer(cluster: LocalCluster, *extra: str) -> NodeProcess:
    observer = cluster.add_observer()
    cluster.start_node(observer.node_id, *extra)
    return observer


def test_an_observer_joins_hosts_replicas_rejoins_and_never_votes(tmp_path: Path) -> None:
    # Automatic moves off: this test is about membership, placement is checked below.
    flags = ("--set", "metadata.auto_rebalance=false")
    cluster = start_cluster(tmp_path, 3, *flags)
    try:
        voters = Admin(_voters(cluster))
        observer = _start_observer(cluster, *flags)
        assert observer.node_id == 4 and "4=" not in cluster.peers
        wait_until(lambda: 4 in _alive_nodes(voters), timeout_s=60, what="the observer registered")
        on_observer = Admin(observer.client_address)
        # Its local copy of the metadata knows the cluster and the controller.
        wait_until(
            lambda: (
                _alive_nodes(on_observer) == {1, 2, 3, 4}
                and on_observer.describe_cluster().controller_id in (1, 2, 3)
            ),
            timeout_s=60,
            what="the observer describing the cluster from its copy",
        )

        voters.create_topic("wide", partitions=2, replication_factor=4)
        wait_until(
            lambda: all(
                sorted(p.replicas) == [1, 2, 3, 4]
                for p in on_observer.describe_topic("wide").partitions
            ),
            timeout_s=30,
            what="the observer describing a topic with a replica on itself",
        )
        sent = [f"record-{i}".encode() for i in range(50)]
        _produce(observer.client_address, "wide", 0, sent)
        assert _consume_all(observer.client_address, "wide", 0) == sent
        assert (Path(observer.data_dir) / "partitions" / "wide-0").is_dir()

        # A restarted observer rejoins: it learns what was created while it was away.
        cluster.kill_node(4, sig=signal.SIGKILL)
        voters.create_topic("while-down", partitions=1, replication_factor=3)
        cluster.start_node(4, *flags)
        on_observer = Admin(observer.client_address)
        wait_listed(
            on_observer,
            "while-down",
            timeout_s=60,
            what="the restarted observer catching up with the metadata",
        )
        wait_until(lambda: 4 in _alive_nodes(voters), timeout_s=60, what="the observer back")
        more = [f"after-restart-{i}".encode() for i in range(20)]
        _produce(observer.client_address, "wide", 1, more)
        assert _consume_all(observer.client_address, "wide", 1) == more

        # The controller made it a learner once; the restart did not change the membership.
        joined = [
            line
            for n in (1, 2, 3)
            for line in Path(cluster.nodes[n].log_file).read_text().splitlines()
            if "node 4 joins the metadata quorum as a learner" in line
        ]
        assert len(joined) == 1, joined
        # The observer does not vote: two voters of three gone, metadata writes stop.
        controller = voters.describe_cluster().controller_id
        assert controller in (1, 2, 3)
        remaining = controller
        for node_id in (1, 2, 3):
            if node_id != remaining:
                cluster.kill_node(node_id, sig=signal.SIGKILL)
        stranded = Admin(
            f"{cluster.nodes[remaining].client_address},{observer.client_address}",
            request_timeout_ms=5000,
        )
        with pytest.raises(ClientError):  # a timeout or NOT_CONTROLLER, as it lands
            stranded.create_topic("no-quorum", partitions=1, replication_factor=1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert on_observer.describe_cluster().controller_id != 4
            time.sleep(0.5)
        assert "no-quorum" not in on_observer.list_topics()
        # A voter back: the quorum (two voters of three) writes again.
        survivor = next(n for n in (1, 2, 3) if n != remaining)
        cluster.start_node(survivor, *flags)
        wait_until(
            lambda: _create_or_exists(stranded, "quorum-back"),
            timeout_s=60,
            what="a metadata write once two voters are up",
        )
        wait_listed(on_observer, "quorum-back", timeout_s=30, what="the observer seeing the write")
    finally:
        cluster.stop()


def test_replicas_rebalance_onto_an_observer_and_a_returning_node(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, 3, *FAST_REBALANCE)
    try:
        admin = Admin(_voters(cluster))
        admin.create_topic("spread", partitions=4, replication_factor=2)
        sent = [f"before-{i}".encode() for i in range(30)]
        _produce(_voters(cluster), "spread", 0, sent)
        assert sorted(_replica_counts(admin, "spread").values()) == [2, 3, 3]

        observer = _start_observer(cluster, *FAST_REBALANCE)
        wait_until(
            lambda: (
                _replica_counts(admin, "spread") == Counter({1: 2, 2: 2, 3: 2, 4: 2})
                and not any(p.leader is None for p in admin.describe_topic("spread").partitions)
            ),
            timeout_s=120,
            what="two replicas of 'spread' on each node, the observer included",
        )
        assert _consume_all(observer.client_address, "spread", 0) == sent

        # A node away while a topic is created gets its share once it is back.
        cluster.kill_node(3, sig=signal.SIGKILL)
        survivors = Admin(_voters(cluster, excluding=(3,)))
        wait_until(lambda: 3 not in _alive_nodes(survivors), timeout_s=60, what="node 3 fenced")
        survivors.create_topic("while-away", partitions=6, replication_factor=2)
        assert 3 not in _replica_counts(survivors, "while-away")
        cluster.start_node(3, *FAST_REBALANCE)
        # 20 replicas: 6 on each of nodes 1, 2 and 4, and node 3's 2, until it gets its 5.
        assert _replica_counts(survivors, "spread", "while-away")[3] == 2
        wait_until(
            lambda: (
                _replica_counts(survivors, "spread", "while-away")
                == Counter({1: 5, 2: 5, 3: 5, 4: 5})
            ),
            timeout_s=180,
            what="replicas moved onto node 3 after it returned",
        )
        later = [f"after-{i}".encode() for i in range(10)]
        _produce(_voters(cluster), "while-away", 0, later)
        assert _consume_all(_voters(cluster), "while-away", 0) == later
        assert _consume_all(_voters(cluster), "spread", 0) == sent
    finally:
        cluster.stop()
