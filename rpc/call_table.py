"""The bookkeeping both kinds of node-to-node calls share (raftlog.rpc.peer_calls for
metadata commands, raftlog.rpc.txn_marker_calls for transaction markers).

A caller numbers its calls (ids never reused by one process), waits for each reply with a
timeout, and fails the calls waiting on a peer whose connection closed or when the node
stops; a reply to a call no longer waited for, or from another node than the callee, is
ignored. The served side counts the calls it serves per caller. Both ends are bounded by
`calls_in_flight_max`: calls waiting for replies, and calls served per caller.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Generic, TypeVar

from raftlog.errors import ProposalDroppedError
from raftlog.types import NodeId

__all__ = ["CallTable", "SendFrame"]

ReplyT = TypeVar("ReplyT")
# Queues one frame for a peer; False when the transport dropped it.
SendFrame = Callable[[NodeId, bytes], bool]


class CallTable(Generic[ReplyT]):
    def __init__(self, *, send: SendFrame, calls_in_flight_max: int) -> None:
        assert calls_in_flight_max > 0, calls_in_flight_max
        self._send = send
        self.calls_in_flight_max = calls_in_flight_max
        self._call_ids = itertools.count()
        # Calls waiting for a reply: call id -> (callee, future).
        self._waiting: dict[int, tuple[NodeId, asyncio.Future[ReplyT]]] = {}
        # How many calls of each caller are being served.
        self._serving: dict[NodeId, int] = {}
        self.closed = False

    # --- the caller's end ---

    def has_room(self) -> bool:
        """Whether another call may wait for a reply now."""
        return len(self._waiting) < self.calls_in_flight_max and not self.closed

    def waiting(self) -> int:
        return len(self._waiting)

    def next_call_id(self) -> int:
        return next(self._call_ids)

    async def call(self, peer: NodeId, call_id: int, frame: bytes, timeout_s: float) -> ReplyT:
        """Send `frame` (the call numbered `call_id`) to `peer` and wait for its reply.
        Raises ProposalDroppedError when the frame could not be queued, TimeoutError, or
        what `fail_peer`/`close` set."""
        future: asyncio.Future[ReplyT] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = (peer, future)
        try:
            if not self._send(peer, frame):
                raise ProposalDroppedError(f"the call to node {peer} could not be queued")
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._waiting.pop(call_id, None)

    def complete(self, sender: NodeId, call_id: int, reply: ReplyT) -> None:
        """A reply arrived from `sender`: the call it answers gets it, if still waiting."""
        waiting = self._waiting.get(call_id)
        if waiting is not None and waiting[0] == sender and not waiting[1].done():
            waiting[1].set_result(reply)

    def fail_peer(self, peer: NodeId, error: Callable[[], BaseException]) -> None:
        """`peer`'s connection to this node closed, with the replies it had queued on it:
        the calls waiting on it fail now."""
        for callee, future in self._waiting.values():
            if callee == peer and not future.done():
                future.set_exception(error())

    def close(self, error: Callable[[], BaseException]) -> None:
        """Serve no more calls and fail every call still waiting."""
        self.closed = True
        for _, future in self._waiting.values():
            if not future.done():
                future.set_exception(error())

    # --- the served end ---

    def serving(self, sender: NodeId) -> int:
        return self._serving.get(sender, 0)

    def start_serving(self, sender: NodeId) -> bool:
        """Count one more call of `sender` being served; False (not counted) when the node
        stops or `sender` has as many served as the bound allows."""
        serving = self.serving(sender)
        if self.closed or serving >= self.calls_in_flight_max:
            return False
        self._serving[sender] = serving + 1
        return True

    def done_serving(self, sender: NodeId) -> None:
        self._serving[sender] -= 1
        assert self._serving[sender] >= 0, (sender, self._serving[sender])
