"""A consumer's side of a consumer group: heartbeats, reconciliation and offset commits.

Theory of operation (the server side is raftlog.metadata.consumer_groups). The member picks its id
once (a UUID) and heartbeats the coordinator, which is the cluster's controller, every
`heartbeat_interval_ms` it is told, listing the partitions it holds. Each answer is the
member's whole assignment: partitions missing from it are revoked, and the consumer commits
their positions (with auto-commit), drops them and heartbeats again at once, which confirms
the revocation so the coordinator can hand them to their new owner. Partitions new in the
answer start at the group's committed offset (else `auto_offset_reset`).

Safety rule of the client: when no heartbeat has been answered for the session timeout
(counted from the *send* of the last answered one, which the coordinator received no
earlier), the coordinator may already have given the member's partitions to others, so the
member drops them all without committing and rejoins with epoch 0. FENCED_MEMBER_EPOCH and
UNKNOWN_MEMBER mean the same at once.

Routing: the coordinator is the controller named by Metadata; NOT_COORDINATOR answers carry
the controller's id and address, and an unreachable coordinator sends the member back to
Metadata. All calls are synchronous and bounded by `request_timeout_ms`. They go over the
cluster's pooled channel to the coordinator (so they share its TLS settings) and carry its
bearer token, like every other call of the client.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from raftlog.client._connection import Cluster, TopicPartition, translate_rpc_error
from raftlog.client.errors import ClientError, ServerError, server_error
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc

__all__ = ["GroupMember", "HeartbeatAnswer"]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
# Answers that mean "you are no longer the member you think": drop everything, rejoin.
_REJOIN_CODES = frozenset({pb.FENCED_MEMBER_EPOCH, pb.UNKNOWN_MEMBER})
# A heartbeat that waits longer than this is as good as lost (the session is short).
HEARTBEAT_TIMEOUT_MS_MAX = 5000


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    """What one heartbeat round gave: the new assignment (None when nothing was learned)
    and whether the member must drop everything first (fenced or session lost)."""

    assignment: frozenset[TopicPartition] | None
    lost: bool = False


class GroupMember:
    """The membership of one consumer in one group (module docstring); not thread-safe."""

    def __init__(
        self,
        cluster: Cluster,
        group_id: str,
        *,
        rebalance_timeout_ms: int,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        member_id: str | None = None,
    ) -> None:
        if not isinstance(group_id, str) or not 1 <= len(group_id) <= 255:
            raise ClientError(f"group_id must be a string of 1-255 characters, got {group_id!r}")
        self.group_id = group_id
        self.member_id = member_id or uuid.uuid4().hex
        self.member_epoch = JOIN_EPOCH
        self.topics: tuple[str, ...] = ()
        self._cluster = cluster
        self._clock = clock
        self._sleep = sleep
        self._retry_backoff_s = cluster.config.retry_backoff_ms / 1000
        self._rebalance_timeout_ms = rebalance_timeout_ms
        self._request_timeout_ms = cluster.config.request_timeout_ms
        self._heartbeat_interval_s = 0.5  # until the coordinator says
        self._session_timeout_s: float | None = None  # known after the first answer
        self._next_heartbeat_at = float("-inf")
        self._last_answered_send_at: float | None = None
        self._coordinator: str | None = None
        # The token metadata the cluster sends on every call, if any.
        self._call_metadata = getattr(cluster, "_call_metadata", None)

    # -- heartbeats --------------------------------------------------------------------------

    def heartbeat_due(self) -> bool:
        return self._clock() >= self._next_heartbeat_at

    def seconds_to_heartbeat(self) -> float:
        return max(0.0, self._next_heartbeat_at - self._clock())

    def hurry(self) -> None:
        """Heartbeat at the next chance (a revocation to confirm, a subscription changed)."""
        self._next_heartbeat_at = self._clock()

    def session_lost(self) -> bool:
        """True when the coordinator may have moved our partitions (module docstring)."""
        if self._last_answered_send_at is None or self._session_timeout_s is None:
            return False
        return self._clock() - self._last_answered_send_at > self._session_timeout_s

    def heartbeat(self, owned: Iterable[TopicPartition]) -> HeartbeatAnswer:
        """One heartbeat; never raises for what a later heartbeat can fix."""
        if self.session_lost():
            self._rejoin()
            return HeartbeatAnswer(None, lost=True)
        sent_at = self._clock()
        request = pb.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.member_epoch,
            topics=list(self.topics),
            owned=topic_partitions(owned),
            rebalance_timeout_ms=self._rebalance_timeout_ms,
        )
        timeout_ms = min(self._request_timeout_ms, HEARTBEAT_TIMEOUT_MS_MAX)
        self._next_heartbeat_at = sent_at + self._heartbeat_interval_s
        response = self._call("ConsumerGroupHeartbeat", request, timeout_ms=timeout_ms)
        if response is None:
            return HeartbeatAnswer(None)
        if response.error.code in _REJOIN_CODES:
            self._rejoin()
            return HeartbeatAnswer(None, lost=True)
        if response.error.code != pb.NONE:
            raise server_error(response.error, concerning=f"heartbeat of group {self.group_id!r}")
        self.member_epoch = response.member_epoch
        self._heartbeat_interval_s = max(1, response.heartbeat_interval_ms) / 1000
        self._session_timeout_s = max(1, response.session_timeout_ms) / 1000
        self._next_heartbeat_at = sent_at + self._heartbeat_interval_s
        self._last_answered_send_at = sent_at
        assert self.member_epoch > JOIN_EPOCH, self.member_epoch
        return HeartbeatAnswer(partitions_of(response.assignment))

    def _rejoin(self) -> None:
        self.member_epoch = JOIN_EPOCH
        self._last_answered_send_at = None
        self._next_heartbeat_at = self._clock()

    def leave(self) -> None:
        """Tell the coordinator at once (best effort) so our partitions move now."""
        request = pb.LeaveGroupRequest(group_id=self.group_id, member_id=self.member_id)
        if self.member_epoch != JOIN_EPOCH:
            self._call("LeaveGroup", request, timeout_ms=min(self._request_timeout_ms, 2000))
        self.member_epoch = JOIN_EPOCH

    # -- offsets -----------------------------------------------------------------------------

    def commit(self, offsets: Mapping[TopicPartition, int], *, as_member: bool) -> None:
        """Commit `offsets` (next offsets to consume) durably; raises what cannot be retried."""
        if not offsets:
            return
        request = pb.OffsetCommitRequest(
            group_id=self.group_id,
            member_id=self.member_id if as_member else "",
            member_epoch=self.member_epoch if as_member else LEAVE_EPOCH,
            offsets=[
                pb.PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                for tp, offset in sorted(offsets.items())
            ],
            timeout_ms=max(1, self._request_timeout_ms * 4 // 5),
        )
        self._call_until_answered("OffsetCommit", request, what="offset commit")

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        wanted = sorted(set(partitions))
        request = pb.OffsetFetchRequest(group_id=self.group_id, partitions=topic_partitions(wanted))
        response = self._call_until_answered("OffsetFetch", request, what="offset fetch")
        found = {
            TopicPartition(o.topic, o.partition): (o.offset if o.offset >= 0 else None)
            for o in response.offsets
        }
        return {tp: found.get(tp) for tp in wanted}

    def _call_until_answered(self, rpc: str, request: Any, *, what: str) -> Any:
        """Retry a lost coordinator (NOT_COORDINATOR, unreachable) for one request timeout."""
        deadline = self._clock() + self._request_timeout_ms / 1000
        while True:
            response = self._call(rpc, request, timeout_ms=self._request_timeout_ms)
            if response is not None and response.error.code == pb.NONE:
                return response
            if response is not None and response.error.code != pb.NOT_COORDINATOR:
                error = server_error(
                    response.error, concerning=f"{what} of group {self.group_id!r}"
                )
                if not error.retriable or self._clock() >= deadline:
                    raise error
            elif self._clock() >= deadline:
                raise ServerError(
                    "NOT_COORDINATOR",
                    "no group coordinator answered within request_timeout_ms",
                    concerning=f"{what} of group {self.group_id!r}",
                    retriable=True,
                )
            self._sleep(self._retry_backoff_s)  # an election or a hop to the new controller

    # -- routing -----------------------------------------------------------------------------

    def _call(self, rpc: str, request: Any, *, timeout_ms: int) -> Any | None:
        """The answer, or None when the coordinator was not reached or is not the
        coordinator (the next call goes where the answer pointed, or asks Metadata)."""
        try:
            stub = self._coordinator_stub()
            response = getattr(stub, rpc)(
                request, timeout=timeout_ms / 1000, metadata=self._call_metadata
            )
        except grpc.RpcError as error:
            failure = translate_rpc_error(
                error,
                address=self._coordinator or "?",
                operation=f"Groups.{rpc}",
                timeout_ms=timeout_ms,
            )
            if not failure.retriable:
                raise failure from None
            self._forget_coordinator(None)
            return None
        except ClientError as error:
            if not error.retriable:
                raise
            return None
        if response.error.code == pb.NOT_COORDINATOR:
            self._forget_coordinator(response.error.leader_address or None)
            return None if rpc == "ConsumerGroupHeartbeat" else response
        return response

    def _coordinator_stub(self) -> Any:
        address = self._coordinator or self._discover_coordinator()
        self._coordinator = address
        # The cluster's pooled channel (bounded, TLS as configured), looked up per call
        # because the pool may close it to make room.
        channel = self._cluster._channel(address).channel
        return pb_grpc.GroupsStub(channel)  # type: ignore[no-untyped-call]

    def _discover_coordinator(self) -> str:
        metadata = self._cluster.refresh_metadata(list(self.topics))
        controller = metadata.controller_id
        address = metadata.nodes.get(controller) if controller is not None else None
        if not address:
            raise ServerError(
                "NOT_COORDINATOR",
                "no controller known (an election may be under way)",
                concerning=f"group {self.group_id!r}",
                retriable=True,
            )
        return address

    def _forget_coordinator(self, hint: str | None) -> None:
        self._coordinator = hint

    def close(self) -> None:
        self._forget_coordinator(None)


def topic_partitions(partitions: Iterable[tuple[str, int]]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(set(partitions)):
        by_topic.setdefault(topic, []).append(partition)
    return [pb.TopicPartitions(topic=t, partitions=p) for t, p in by_topic.items()]


def partitions_of(entries: Iterable[pb.TopicPartitions]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(e.topic, int(p)) for e in entries for p in e.partitions)
