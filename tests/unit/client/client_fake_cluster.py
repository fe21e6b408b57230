"""An in-process fake raftlog cluster: the Log and Admin gRPC services over an in-memory log.

This is a simulated implementation of the server side of the raftlog.v1 API, not a mock of
client code: each fake node is a real gRPC server on a loopback port, and the nodes share one
`FakeClusterState` (topics, partitions with their batches, leaders, the controller). It keeps
the server's promises the client relies on: batches are CRC-checked and patched with their
base offset and leader epoch (never decoded), a partition's first record is at offset 0
(Raft's own entries take no offset clients see), fetches return whole batches below the high
watermark only, a control batch (a Kafka control batch such as a transaction marker, put
there by `append_control`) takes an offset the consumer steps over, an
idempotent producer's retried batch is answered DUPLICATE_SEQUENCE with its original offset,
and a node that does not lead a partition (or the metadata quorum) answers NOT_LEADER
(NOT_CONTROLLER) with a hint, unless told to leave the hint out.

Fault knobs, all deterministic (no timers): `advertised_leader` (what Metadata claims, to
make the client's cache stale), `hint_leader`, `fail_next` (error codes to answer the next
requests of one RPC with), `drop_next_produce_responses` (append, then fail the call as if
the answer was lost), `produce_gate` (hold produce answers until the test opens it),
`produce_holds` (hold the next arriving produce requests one by one, each until its own event
is set), and
`high_watermark_lag` (records appended but not yet committed) and one planted server bug,
`lying_fetch_high_watermark`, that the consumer must catch.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc

from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.storage.batch import patch_base_offset_and_epoch, verify_batch
from raftlog.storage.records import CONTROL_LEADER_CHANGE, encode_control_batch

__all__ = ["FakeCluster", "FakeClusterState", "FakePartition", "ManualClock"]

REMEMBERED_BATCHES_MAX = 5


class ManualClock:
    """A monotonic clock the test moves by hand (the clients' clock port)."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


NO_HINT = -1


@dataclass
class FakePartition:
    leader_id: int
    replicas: list[int]
    epoch: int = 1
    batches: list[bytes] = field(default_factory=list)
    log_start_offset: int = 0
    log_end_offset: int = 0
    # Offsets appended but not committed: the high watermark trails the log end by this.
    high_watermark_lag: int = 0
    advertised_leader: int | None = None  # what Metadata says, when it differs
    # producer id -> (base_sequence, last_sequence, base_offset, last_offset, epoch) of its
    # batches, oldest first
    producers: dict[int, list[tuple[int, int, int, int, int]]] = field(default_factory=dict)
    duplicates_answered: int = 0
    out_of_order_answered: int = 0

    @property
    def high_watermark(self) -> int:
        return max(self.log_start_offset, self.log_end_offset - self.high_watermark_lag)

    def append(self, batch: bytes) -> tuple[int, int]:
        header = verify_batch(batch)
        buf = bytearray(batch)
        base = self.log_end_offset
        patch_base_offset_and_epoch(buf, 0, base_offset=base, leader_epoch=self.epoch)
        self.batches.append(bytes(buf))
        self.log_end_offset = base + header.offset_count
        return base, self.log_end_offset - 1


@dataclass
class FakeClusterState:
    """Everything the fake nodes share; guarded by `condition` (fetch long polls wait on it)."""

    addresses: dict[int, str] = field(default_factory=dict)
    controller_id: int = 1
    topics: dict[str, list[FakePartition]] = field(default_factory=dict)
    hint_leader: bool = True
    fail_next: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    drop_next_produce_responses: int = 0
    produce_gate: threading.Event = field(default_factory=threading.Event)
    # Each arriving produce request takes the first event (if any) and waits for it.
    produce_holds: deque[threading.Event] = field(default_factory=deque)
    produce_holds_taken: list[threading.Event] = field(default_factory=list)
    produce_answers: int = 0  # produce requests that reached the log (not refused early)
    requests: dict[tuple[int, str], int] = field(default_factory=lambda: defaultdict(int))
    next_producer_id: int = 1000
    producer_epoch: int = 0  # the epoch InitProducerId hands out
    # A planted server bug for the consumer's check: Fetch reports this high watermark.
    lying_fetch_high_watermark: int | None = None
    condition: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.produce_gate.set()

    def create_topic(self, name: str, partitions: int, replication_factor: int = 1) -> None:
        with self.condition:
            nodes = sorted(self.addresses)
            for index in range(partitions):
                replicas = [nodes[(index + r) % len(nodes)] for r in range(replication_factor)]
                partition = FakePartition(leader_id=replicas[0], replicas=replicas)
                self.topics.setdefault(name, []).append(partition)

    def partition(self, topic: str, index: int) -> FakePartition:
        return self.topics[topic][index]

    def stored_batches(self, topic: str, index: int) -> list[bytes]:
        with self.condition:
            return list(self.topics[topic][index].batches)

    def append_control(self, topic: str, index: int) -> None:
        with self.condition:
            self.topics[topic][index].append(leader_change_batch())
            self.condition.notify_all()

    def commit_all(self, topic: str, index: int) -> None:
        with self.condition:
            self.topics[topic][index].high_watermark_lag = 0
            self.condition.notify_all()


def leader_change_batch() -> bytes:
    return encode_control_batch(CONTROL_LEADER_CHANGE, b"\x00\x00", timestamp_ms=0)


def error(code: int, message: str = "", *, leader_id: int = NO_HINT, address: str = "") -> pb.Error:
    return pb.Error(
        code=code,
        message=message or pb.ErrorCode.Name(code),
        leader_id=leader_id,
        leader_address=address,
    )


class FakeNode(pb_grpc.LogServicer, pb_grpc.AdminServicer):  # type: ignore[misc]
    """One node's services over the shared state."""

    def __init__(self, node_id: int, state: FakeClusterState) -> None:
        self.node_id = node_id
        self.state = state

    # -- helpers ----------------------------------------------------------------------------

    def _count(self, rpc: str) -> int | None:
        """Count the request; pop and return a planted error code for it, if any."""
        self.state.requests[(self.node_id, rpc)] += 1
        self.state.condition.notify_all()  # tests wait for requests to arrive
        planted = self.state.fail_next.get(rpc)
        return planted.pop(0) if planted else None

    def _partition_error(self, topic: str, index: int) -> pb.Error | None:
        partitions = self.state.topics.get(topic)
        if partitions is None or not 0 <= index < len(partitions):
            return error(pb.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}/{index} does not exist")
        leader = partitions[index].leader_id
        if leader != self.node_id:
            if not self.state.hint_leader:
                return error(pb.NOT_LEADER, f"node {self.node_id} does not lead {topic}/{index}")
            return error(
                pb.NOT_LEADER,
                f"node {self.node_id} does not lead {topic}/{index}",
                leader_id=leader,
                address=self.state.addresses[leader],
            )
        return None

    def _planted(self, code: int, topic: str, index: int) -> pb.Error:
        if code == pb.NOT_LEADER:
            leader = self.state.topics[topic][index].leader_id
            return error(code, "planted", leader_id=leader, address=self.state.addresses[leader])
        return error(code, "planted")

    # -- Log --------------------------------------------------------------------------------

    def Produce(self, request: pb.ProduceRequest, context: Any) -> pb.ProduceResponse:
        with self.state.condition:
            planted = self._count("Produce")  # counted on arrival, before the gate
            hold = self.state.produce_holds.popleft() if self.state.produce_holds else None
            if hold is not None:
                self.state.produce_holds_taken.append(hold)
        self.state.produce_gate.wait()
        if hold is not None:
            hold.wait()
        with self.state.condition:
            if planted is not None:
                return pb.ProduceResponse(
                    error=self._planted(planted, request.topic, request.partition)
                )
            refusal = self._partition_error(request.topic, request.partition)
            if refusal is not None:
                return pb.ProduceResponse(error=refusal)
            partition = self.state.topics[request.topic][request.partition]
            response = self._append(partition, list(request.batches))
            self.state.produce_answers += 1
            self.state.condition.notify_all()
            drop = response.error.code == pb.NONE and self.state.drop_next_produce_responses > 0
            if drop:
                self.state.drop_next_produce_responses -= 1
        if drop:
            context.abort(grpc.StatusCode.UNAVAILABLE, "fake: response dropped after append")
        return response

    def _append(self, partition: FakePartition, batches: list[bytes]) -> pb.ProduceResponse:
        assert len(batches) == 1, "the client sends one batch per request"
        header = verify_batch(batches[0])
        if header.producer_id >= 0:
            refusal = self._check_sequence(partition, header)
            if refusal is not None:
                return refusal
        base, last_offset = partition.append(batches[0])
        if header.producer_id >= 0:
            last_sequence = header.base_sequence + header.record_count - 1
            partition.producers.setdefault(header.producer_id, []).append(
                (header.base_sequence, last_sequence, base, last_offset, header.producer_epoch)
            )
        return pb.ProduceResponse(
            base_offset=base,
            last_offset=last_offset,
            log_append_time_ms=-1,
            high_watermark=partition.high_watermark,
        )

    @staticmethod
    def _check_sequence(partition: FakePartition, header: Any) -> pb.ProduceResponse | None:
        """As the real leader (partition/producer_state.py): the last five batches of a
        producer's current epoch are remembered, a batch equal to one of them is a duplicate,
        an older epoch is fenced and a newer one starts again at sequence 0; a producer the
        partition does not know yet may start at any sequence (Kafka's ProducerAppendInfo)."""
        written = partition.producers.get(header.producer_id, [])
        if not written:
            return None
        epoch = written[-1][4]
        if header.producer_epoch < epoch:
            return pb.ProduceResponse(error=error(pb.INVALID_PRODUCER_EPOCH, f"epoch {epoch}"))
        written = [batch for batch in written if batch[4] == header.producer_epoch]
        last_sequence = header.base_sequence + header.record_count - 1
        for remembered in written[-REMEMBERED_BATCHES_MAX:]:
            if remembered[:2] == (header.base_sequence, last_sequence):
                partition.duplicates_answered += 1
                return pb.ProduceResponse(
                    error=error(pb.DUPLICATE_SEQUENCE, "already written"),
                    base_offset=remembered[2],
                    last_offset=remembered[3],
                )
        expected = written[-1][1] + 1 if written else 0  # a new epoch starts at 0
        if header.base_sequence != expected:
            partition.out_of_order_answered += 1
            return pb.ProduceResponse(error=error(pb.OUT_OF_ORDER_SEQUENCE, f"expected {expected}"))
        return None

    def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        with self.state.condition:
            planted = self._count("Fetch")
            if planted is not None:
                return pb.FetchResponse(
                    error=self._planted(planted, request.topic, request.partition)
                )
            refusal = self._partition_error(request.topic, request.partition)
            if refusal is not None:
                return pb.FetchResponse(error=refusal)
            partition = self.state.topics[request.topic][request.partition]
            if not partition.log_start_offset <= request.offset <= partition.high_watermark:
                return pb.FetchResponse(
                    error=error(pb.OFFSET_OUT_OF_RANGE, f"offset {request.offset}"),
                    high_watermark=partition.high_watermark,
                )
            # Long poll: wait (server side) for committed data past the offset.
            self.state.condition.wait_for(
                lambda: partition.high_watermark > request.offset, request.max_wait_ms / 1000
            )
            data = b"".join(self._batches_from(partition, request.offset, request.max_bytes))
            lie = self.state.lying_fetch_high_watermark
            return pb.FetchResponse(
                batches=data,
                high_watermark=partition.high_watermark if lie is None else lie,
                log_start_offset=partition.log_start_offset,
                leader_epoch=partition.epoch,
            )

    @staticmethod
    def _batches_from(partition: FakePartition, offset: int, max_bytes: int) -> Iterator[bytes]:
        sent_bytes = 0
        for batch in partition.batches:
            header = verify_batch(batch)
            if header.last_offset < offset:
                continue
            if header.last_offset >= partition.high_watermark:
                return
            if sent_bytes and sent_bytes + len(batch) > max_bytes:
                return
            sent_bytes += len(batch)
            yield batch

    def ListOffsets(self, request: pb.ListOffsetsRequest, context: Any) -> pb.ListOffsetsResponse:
        with self.state.condition:
            planted = self._count("ListOffsets")
            if planted is not None:
                return pb.ListOffsetsResponse(
                    error=self._planted(planted, request.topic, request.partition)
                )
            refusal = self._partition_error(request.topic, request.partition)
            if refusal is not None:
                return pb.ListOffsetsResponse(error=refusal)
            partition = self.state.topics[request.topic][request.partition]
            if request.spec == pb.EARLIEST:
                return pb.ListOffsetsResponse(offset=partition.log_start_offset)
            return pb.ListOffsetsResponse(offset=partition.high_watermark)

    def Metadata(self, request: pb.MetadataRequest, context: Any) -> pb.MetadataResponse:
        with self.state.condition:
            self._count("Metadata")
            names = list(request.topics) or sorted(self.state.topics)
            topics = [self._topic_info(name) for name in names if name in self.state.topics]
            return pb.MetadataResponse(
                cluster_id="fake",
                controller_id=self.state.controller_id,
                nodes=self._nodes(),
                topics=topics,
            )

    def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: Any
    ) -> pb.InitProducerIdResponse:
        with self.state.condition:
            self._count("InitProducerId")
            self.state.next_producer_id += 1
            return pb.InitProducerIdResponse(
                producer_id=self.state.next_producer_id, producer_epoch=self.state.producer_epoch
            )

    def DescribeProducers(
        self, request: pb.DescribeProducersRequest, context: Any
    ) -> pb.DescribeProducersResponse:
        """The producer's last *committed* batch (below the high watermark), as the server."""
        with self.state.condition:
            planted = self._count("DescribeProducers")
            if planted is not None:
                return pb.DescribeProducersResponse(
                    error=self._planted(planted, request.topic, request.partition)
                )
            refusal = self._partition_error(request.topic, request.partition)
            if refusal is not None:
                return pb.DescribeProducersResponse(error=refusal)
            partition = self.state.topics[request.topic][request.partition]
            committed = [
                batch
                for batch in partition.producers.get(request.producer_id, [])
                if batch[3] < partition.high_watermark
            ]
            if not committed:
                return pb.DescribeProducersResponse(
                    known=False, producer_epoch=-1, last_sequence=-1, last_offset=-1
                )
            _, last_sequence, _, last_offset, epoch = committed[-1]
            return pb.DescribeProducersResponse(
                known=True,
                producer_epoch=epoch,
                last_sequence=last_sequence,
                last_offset=last_offset,
            )

    def _nodes(self) -> list[pb.Node]:
        return [
            pb.Node(node_id=node_id, address=address, alive=True)
            for node_id, address in sorted(self.state.addresses.items())
        ]

    def _topic_info(self, name: str) -> pb.TopicInfo:
        partitions = self.state.topics[name]
        infos = [
            pb.PartitionInfo(
                partition=index,
                leader_id=p.advertised_leader if p.advertised_leader is not None else p.leader_id,
                leader_epoch=p.epoch,
                replicas=p.replicas,
                high_watermark=p.high_watermark,
                log_start_offset=p.log_start_offset,
            )
            for index, p in enumerate(partitions)
        ]
        return pb.TopicInfo(
            name=name,
            topic_id=f"id-{name}",
            replication_factor=len(partitions[0].replicas),
            partitions=infos,
        )

    # -- Admin ------------------------------------------------------------------------------

    def _not_controller(self) -> pb.Error | None:
        if self.node_id == self.state.controller_id:
            return None
        controller = self.state.controller_id
        return error(
            pb.NOT_CONTROLLER,
            f"node {self.node_id} is not the controller",
            leader_id=controller,
            address=self.state.addresses[controller] if self.state.hint_leader else "",
        )

    def CreateTopic(self, request: pb.CreateTopicRequest, context: Any) -> pb.CreateTopicResponse:
        with self.state.condition:
            planted = self._count("CreateTopic")
            if planted is not None:  # e.g. NOT_CONTROLLER without a hint: an election
                return pb.CreateTopicResponse(error=error(planted, "planted"))
            refusal = self._not_controller()
            if refusal is None and request.name in self.state.topics:
                refusal = error(pb.TOPIC_ALREADY_EXISTS, f"topic {request.name!r} already exists")
            if refusal is None and request.replication_factor > len(self.state.addresses):
                refusal = error(
                    pb.INVALID_REPLICATION_FACTOR,
                    f"replication factor {request.replication_factor} exceeds "
                    f"{len(self.state.addresses)} nodes",
                )
            if refusal is not None:
                return pb.CreateTopicResponse(error=refusal)
        self.state.create_topic(request.name, request.partitions, request.replication_factor)
        with self.state.condition:
            return pb.CreateTopicResponse(topic=self._topic_info(request.name))

    def DeleteTopic(self, request: pb.DeleteTopicRequest, context: Any) -> pb.DeleteTopicResponse:
        with self.state.condition:
            self._count("DeleteTopic")
            refusal = self._not_controller()
            if refusal is None and request.name not in self.state.topics:
                refusal = error(pb.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {request.name!r}")
            if refusal is not None:
                return pb.DeleteTopicResponse(error=refusal)
            del self.state.topics[request.name]
            return pb.DeleteTopicResponse()

    def CreatePartitions(
        self, request: pb.CreatePartitionsRequest, context: Any
    ) -> pb.CreatePartitionsResponse:
        with self.state.condition:
            self._count("CreatePartitions")
            refusal = self._not_controller()
            current = len(self.state.topics.get(request.name, []))
            if refusal is None and request.total_count <= current:
                refusal = error(pb.INVALID_PARTITIONS, f"topic has {current} partitions")
            if refusal is not None:
                return pb.CreatePartitionsResponse(error=refusal)
            rf = len(self.state.topics[request.name][0].replicas)
        self.state.create_topic(request.name, request.total_count - current, rf)
        return pb.CreatePartitionsResponse()

    def DescribeTopic(
        self, request: pb.DescribeTopicRequest, context: Any
    ) -> pb.DescribeTopicResponse:
        with self.state.condition:
            self._count("DescribeTopic")
            if request.name not in self.state.topics:
                return pb.DescribeTopicResponse(
                    error=error(pb.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {request.name!r}")
                )
            return pb.DescribeTopicResponse(topic=self._topic_info(request.name))

    def ListTopics(self, request: pb.ListTopicsRequest, context: Any) -> pb.ListTopicsResponse:
        with self.state.condition:
            self._count("ListTopics")
            return pb.ListTopicsResponse(names=sorted(self.state.topics))

    def DescribeCluster(
        self, request: pb.DescribeClusterRequest, context: Any
    ) -> pb.DescribeClusterResponse:
        with self.state.condition:
            self._count("DescribeCluster")
            return pb.DescribeClusterResponse(
                cluster_id="fake", controller_id=self.state.controller_id, nodes=self._nodes()
            )


class FakeCluster:
    """`nodes` fake nodes on loopback ports sharing one state; node 1 is the controller."""

    def __init__(self, nodes: int = 2) -> None:
        self.state = FakeClusterState()
        self._servers: list[Any] = []
        for node_id in range(1, nodes + 1):
            server = grpc.server(ThreadPoolExecutor(max_workers=8))
            node = FakeNode(node_id, self.state)
            pb_grpc.add_LogServicer_to_server(node, server)
            pb_grpc.add_AdminServicer_to_server(node, server)
            port = server.add_insecure_port("127.0.0.1:0")
            assert port > 0
            server.start()
            self.state.addresses[node_id] = f"127.0.0.1:{port}"
            self._servers.append(server)

    def address(self, node_id: int) -> str:
        return self.state.addresses[node_id]

    @property
    def bootstrap(self) -> str:
        return ",".join(self.state.addresses[n] for n in sorted(self.state.addresses))

    def release_produce_holds(self) -> None:
        with self.state.condition:
            for hold in [*self.state.produce_holds, *self.state.produce_holds_taken]:
                hold.set()

    def stop(self) -> None:
        self.state.produce_gate.set()
        self.release_produce_holds()
        for server in self._servers:
            server.stop(grace=None).wait()
