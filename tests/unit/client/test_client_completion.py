"""Where a producer's futures complete: a success on gRPC's thread, a failure on the sender's.

A written batch whose records have no callbacks is completed by the thread that received the
answer, so the caller waiting on `send().result()` is not woken through the sender thread
(raftlog.client._sender, "Where an answer is handled"); record callbacks stay on the sender
thread. The test stops the sender thread inside a delivery callback of
a failed batch (failures still complete there) and checks that an answer arriving meanwhile
still completes its record: with the answer handed to the sender thread, it would wait for
the callback to return.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

from client_fake_cluster import FakeCluster

from raftlog.client import Producer, RecordMetadata
from raftlog.client.errors import DeliveryFailedError
from raftlog.rpc.v1 import raftlog_pb2 as pb

TIMEOUT_S = 30.0
SENDER_THREAD = "raftlog-producer-sender"


def produce_requests(cluster: FakeCluster) -> int:
    with cluster.state.condition:
        return sum(n for (_, rpc), n in cluster.state.requests.items() if rpc == "Produce")


def wait_for_produce_requests(cluster: FakeCluster, count: int) -> None:
    with cluster.state.condition:
        arrived = cluster.state.condition.wait_for(
            lambda: (
                sum(n for (_, rpc), n in cluster.state.requests.items() if rpc == "Produce")
                >= count
            ),
            TIMEOUT_S,
        )
    assert arrived, f"{count} produce requests did not arrive"


def test_a_success_completes_while_the_sender_thread_is_stopped(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 2)  # events/0 led by node 1, events/1 by node 2
    held_success, held_failure = threading.Event(), threading.Event()
    sender_stopped, sender_released = threading.Event(), threading.Event()
    callback_threads: list[str] = []

    def stop_the_sender(_: Future[RecordMetadata]) -> None:
        callback_threads.append(threading.current_thread().name)
        sender_stopped.set()
        assert sender_released.wait(TIMEOUT_S)

    client = Producer(cluster.bootstrap, linger_ms=0, retry_backoff_ms=1)
    try:
        # A partition's first batch goes alone: write one to each before the race.
        for partition in (0, 1):
            assert client.send("events", value=b"first", partition=partition).result(TIMEOUT_S)
        before = produce_requests(cluster)
        cluster.state.produce_holds.extend((held_success, held_failure))
        succeeding = client.send("events", value=b"written", partition=1)
        wait_for_produce_requests(cluster, before + 1)
        cluster.state.fail_next["Produce"] = [pb.INVALID_RECORD]  # not retriable
        failing = client.send("events", value=b"refused", partition=0)
        wait_for_produce_requests(cluster, before + 2)
        failing.add_done_callback(stop_the_sender)  # in place before its answer can come
        held_failure.set()
        assert sender_stopped.wait(TIMEOUT_S)
        assert callback_threads == [SENDER_THREAD]  # the failure is the sender thread's

        held_success.set()
        # The sender thread still waits in the callback above; the answer completes anyway.
        assert succeeding.result(TIMEOUT_S).offset == 1
        assert not sender_released.is_set()
    finally:
        sender_released.set()
        cluster.release_produce_holds()
        client.close()
    assert isinstance(failing.exception(0), DeliveryFailedError)
    with cluster.state.condition:
        assert len(cluster.state.partition("events", 1).batches) == 2
