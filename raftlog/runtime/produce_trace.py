"""Where a produce request's time goes: stage boundaries stamped on the node, per proposal.

Theory of operation. A front end that serves metrics opens a `RequestTrace` when it has a
produce request in hand (`begin`: gRPC when the handler starts, Kafka when the frame is
taken off the connection) and makes it the task's current trace (a context variable, so
nothing between the front end and the group passes it along). `RaftGroup.propose` adds one
`ProposalTrace` per proposed batch to the current trace and to the group's `StageTraces`,
which the host stamps as the proposal moves through its passes; the front end calls
`RequestTrace.finish` once the response is written, and each proposal that was applied
reports its stages to the recorder. Boundaries, each a reading of this module's
monotonic clock (a port: tests install a fake one):

    received   the front end has the request (decoded for gRPC; the frame for Kafka)
    proposed   `RaftGroup.propose` returned: checks, record walk and sequence check done
    picked     the host's pass took the group's Ready holding the entry
    sent       the Ready's messages (the appends to the followers) handed to the transport
    written    the leader's append written to its segment (buffered, not yet durable)
    durable    the leader's own fsync covers the entry
    replicated followers' acknowledgements reached a quorum with the leader (the
               (quorum - 1)-th highest follower match covers the entry)
    committed  the core's commit offset covers the entry
    applied    the entry was applied and its waiter answered
    responded  the response was written (gRPC: the handler returned it)

Stages reported (`STAGES`), each the time between two boundaries:

    queue      received -> proposed        pass_wait  proposed -> picked
    send       picked -> sent              write      sent -> written
    quorum     written -> committed        apply      committed -> applied
    respond    applied -> responded        total      received -> responded
    fsync      written -> durable          replicate  sent -> replicated

The first seven add up to `total` for every request; `fsync` and `replicate` are the two
legs `quorum` waits for, which run in parallel (so they are not summed). A proposal that was
dropped, failed or answered a retry by its original reports nothing; a request with several
batches reports one sample per batch.

Cost: only while the process's recorder traces produce (`Recorder.traces_produce`, on when
the node serves metrics); otherwise `RaftGroup.propose` reads one context variable and each
pass checks one deque per group. `benchmarks/suites/latency.py` measures the traced cost.
"""

from __future__ import annotations

import contextvars
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from raftlog.runtime import recorder as metrics
from raftlog.runtime.clock import MonotonicClock, SystemMonotonicClock

if TYPE_CHECKING:
    from raftlog.raft.node import RaftNode
    from raftlog.raft.types import Message

__all__ = [
    "STAGES",
    "ProposalTrace",
    "RequestTrace",
    "StageTraces",
    "begin",
    "current",
    "stage_seconds",
    "use_clock",
]

# Boundary indexes into `ProposalTrace.at`.
PROPOSED, PICKED, SENT, WRITTEN, DURABLE, REPLICATED, COMMITTED, APPLIED = range(8)
BOUNDARIES = 8
STAGES = (
    "queue", "pass_wait", "send", "write", "quorum", "apply", "respond", "total",
    "fsync", "replicate",
)  # fmt: skip
UNSET = 0.0  # a boundary not reached (monotonic readings here are never 0.0)

_clock: MonotonicClock = SystemMonotonicClock()
_current: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar(
    "raftlog_produce_trace", default=None
)


def use_clock(clock: MonotonicClock) -> MonotonicClock:
    """Read boundaries from `clock` (tests); returns the clock used before."""
    global _clock
    previous, _clock = _clock, clock
    return previous


def now() -> float:
    return _clock.monotonic()


class ProposalTrace:
    """The boundaries one proposed batch reached (`at[i]`, UNSET until reached)."""

    __slots__ = ("at", "last_offset")

    def __init__(self, last_offset: int, proposed_s: float) -> None:
        self.last_offset = last_offset
        self.at = [UNSET] * BOUNDARIES
        self.at[PROPOSED] = proposed_s


class RequestTrace:
    """One produce request's trace, opened by its front end."""

    __slots__ = ("proposals", "protocol", "received_s")

    def __init__(self, protocol: str, received_s: float) -> None:
        self.protocol = protocol
        self.received_s = received_s
        self.proposals: list[ProposalTrace] = []

    def attach(self) -> contextvars.Token[RequestTrace | None]:
        """Make this the current task's trace (undo with `detach`)."""
        return _current.set(self)

    @staticmethod
    def detach(token: contextvars.Token[RequestTrace | None]) -> None:
        _current.reset(token)

    def finish(self) -> None:
        """The response is written: report the stages of every applied proposal."""
        responded_s = now()
        record = metrics.recorder().on_produce_stages
        for proposal in self.proposals:
            seconds = stage_seconds(self.received_s, proposal.at, responded_s)
            if seconds is not None:
                record(self.protocol, seconds)


def begin(protocol: str) -> RequestTrace | None:
    """A trace for a produce request of `protocol` received now; None when the recorder
    does not trace produce (no metrics served: the front end then does nothing more)."""
    if not metrics.recorder().traces_produce:
        return None
    return RequestTrace(protocol, now())


def current() -> RequestTrace | None:
    """The trace of the produce request this task serves, if traced."""
    return _current.get()


def stage_seconds(
    received_s: float, at: list[float], responded_s: float
) -> tuple[float, ...] | None:
    """Each of `STAGES` in seconds (fsync or replicate 0.0 when not seen), or None when the
    proposal never reached `applied` (or missed a boundary on the path to it)."""
    if UNSET in (at[PICKED], at[SENT], at[WRITTEN], at[COMMITTED], at[APPLIED]):
        return None
    # Readings of one monotonic clock, but stamped at different places: a boundary stamped
    # late (committed seen on a step before the pass stamped written) is clamped, so the
    # stages still add up to the total. Spelled out: this runs once per produce.
    proposed = max(at[PROPOSED], received_s)
    picked = max(at[PICKED], proposed)
    sent = max(at[SENT], picked)
    written = max(at[WRITTEN], sent)
    committed = max(at[COMMITTED], written)
    applied = max(at[APPLIED], committed)
    responded = max(responded_s, applied)
    durable, replicated = at[DURABLE], at[REPLICATED]
    return (
        proposed - received_s, picked - proposed, sent - picked, written - sent,
        committed - written, applied - committed, responded - applied,
        responded - received_s,
        max(durable - written, 0.0) if durable != UNSET else 0.0,
        max(replicated - sent, 0.0) if replicated != UNSET else 0.0,
    )  # fmt: skip


class StageTraces:
    """A group's traced proposals not yet applied, in offset order; the host and the group
    stamp them (`mark`) as their entries reach each boundary."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: deque[ProposalTrace] = deque()

    def add(self, request: RequestTrace, last_offset: int) -> None:
        assert not self.pending or self.pending[-1].last_offset < last_offset, last_offset
        proposal = ProposalTrace(last_offset, now())
        request.proposals.append(proposal)
        self.pending.append(proposal)

    def mark(self, boundary: int, last_offset: int, at_s: float | None = None) -> None:
        """Proposals ending at or below `last_offset` reached `boundary` (now, unless
        `at_s`), if they had not yet."""
        stamp = now() if at_s is None else at_s
        for proposal in self.pending:
            if proposal.last_offset > last_offset:
                break
            if proposal.at[boundary] == UNSET:
                proposal.at[boundary] = stamp

    def mark_applied(self, last_offset: int) -> None:
        """Proposals ending at or below `last_offset` were applied: stamped and let go."""
        pending = self.pending
        if not pending or pending[0].last_offset > last_offset:
            return
        stamp = now()
        while pending and pending[0].last_offset <= last_offset:
            at = pending.popleft().at
            at[APPLIED] = stamp
            if at[COMMITTED] == UNSET:  # committed and applied by one step of the pass
                at[COMMITTED] = stamp

    def drop_from(self, base_offset: int) -> None:
        """Proposals at or beyond `base_offset` were truncated: they will never apply."""
        while self.pending and self.pending[-1].last_offset >= base_offset:
            self.pending.pop()

    def on_stepped(self, node: RaftNode) -> None:
        """Messages were stepped into the leader: stamp what the followers' acknowledgements
        (their match offsets) and the commit offset now cover."""
        stamp = now()
        self.mark(COMMITTED, node.commit_offset, stamp)
        voters = node.membership.voters
        needed = len(voters) // 2  # followers that make a quorum with the leader
        matches = sorted(
            (progress.match for peer, progress in node.progress.items()
             if peer != node.node_id and peer in voters),
            reverse=True,
        )  # fmt: skip
        if 0 < needed <= len(matches):
            self.mark(REPLICATED, matches[needed - 1], stamp)

    def sender(
        self, send: Callable[[Message], None], stamps: list[float]
    ) -> Callable[[Message], None]:
        """`send`, stamping into `stamps[0]` when each message was handed over."""

        def send_stamped(message: Message) -> None:
            send(message)
            stamps[0] = now()

        return send_stamped
