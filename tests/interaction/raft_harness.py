"""A deterministic in-memory Raft cluster and the script language of the interaction tests.

Theory of operation. `Cluster` wires real `RaftNode`s to `MemoryStorage` through the shared
`process_ready`, with a FIFO network: every sent message goes to one global queue unless its
link is cut (then it is dropped and the drop is logged). Nothing happens on its own: ticks,
deliveries and Ready processing are explicit, and every node uses `random.Random(node_id)`,
so a script's transcript is byte-for-byte reproducible. Every command first runs, then every
node with a Ready processes it (in node order), and the transcript records every message
sent, every role change, every hard-state save and every applied entry.

Script commands (one per block, `#` lines are comments):

    add-node N                       a node with an empty log and no membership
    campaign N                       start an election at N
    propose N DATA [COUNT]           DATA batch of COUNT records (default 1)
    propose-membership N V,V [L,L]   voters (and learners) proposed at leader N
    transfer N M                     leader N hands leadership to M
    read-index N ID                  ReadIndex request ID at leader N
    compact N OFFSET                 driver of N snapshots and compacts up to OFFSET
    partition A B | C                cut every link between the groups (replaces earlier cuts)
    heal                             restore every link
    deliver [A->B]                   deliver the queued messages (once, not their answers)
    drop [A->B]                      drop the queued messages
    tick N|all [xK]                  K ticks
    stabilize                        deliver and process until nothing is left
    crash N / restart N              lose unsynced state / start again from storage
    status                           one line per node (and progress at the leader)
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable

from raftlog.config import RaftConfig
from raftlog.errors import RaftError
from raftlog.raft.membership import membership_at
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.types import (
    AppendRequest,
    AppendResponse,
    Entry,
    EntryKind,
    HeartbeatRequest,
    HeartbeatResponse,
    Membership,
    Message,
    ReadState,
    Role,
    Snapshot,
    SnapshotMeta,
    SnapshotRequest,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from raftlog.runtime.ready import process_ready
from raftlog.types import NodeId, Offset

STABILIZE_ROUNDS_MAX = 1000


def _ids(nodes: Iterable[int]) -> str:
    return ",".join(str(n) for n in sorted(nodes))


def format_entry(entry: Entry) -> str:
    span = str(entry.offset)
    if entry.offset_count > 1:
        span = f"{entry.offset}..{entry.last_offset}"
    match entry.kind:
        case EntryKind.NOOP:
            body = "noop"
        case EntryKind.CONFIG:
            membership = Membership.decode(entry.data)
            body = f"config v={_ids(membership.voters)} l={_ids(membership.learners)}"
        case _:
            body = entry.data.decode(errors="replace")
    return f"{span}@{entry.term} {body}"


def format_message(message: Message) -> str:
    head = f"{message.sender}->{message.receiver} "
    match message:
        case VoteRequest():
            kind = "PreVote" if message.pre_vote else "Vote"
            extra = " transfer" if message.transfer else ""
            body = f"{kind} term={message.term} last={message.last_offset}@{message.last_term}"
            return head + body + extra
        case VoteResponse():
            kind = "PreVoteResp" if message.pre_vote else "VoteResp"
            verdict = "granted" if message.granted else "rejected"
            return head + f"{kind} term={message.term} {verdict}"
        case AppendRequest():
            entries = ", ".join(format_entry(e) for e in message.entries)
            prev = f"{message.prev_offset}@{message.prev_term}"
            return (
                head
                + f"App term={message.term} prev={prev} commit={message.commit_offset} [{entries}]"
            )
        case AppendResponse() if message.success:
            return head + f"AppResp term={message.term} ok last={message.last_offset}"
        case AppendResponse():
            hint = f"{message.conflict_offset}@{message.conflict_term}"
            return head + (
                f"AppResp term={message.term} reject prev={message.reject_offset} "
                f"last={message.last_offset} conflict={hint}"
            )
        case HeartbeatRequest():
            ctx = f" ctx={message.read_context}" if message.read_context else ""
            ctx += " quiesce" if message.quiesce else ""
            return head + f"Heartbeat term={message.term} commit={message.commit_offset}{ctx}"
        case HeartbeatResponse():
            ctx = f" ctx={message.read_context}" if message.read_context else ""
            return head + f"HeartbeatResp term={message.term}{ctx}"
        case SnapshotRequest():
            meta = message.snapshot.meta
            return head + (
                f"Snapshot term={message.term} offset={meta.offset}@{meta.term} "
                f"v={_ids(meta.membership.voters)}"
            )
        case TimeoutNow():
            return head + f"TimeoutNow term={message.term}"


class Cluster:
    """Nodes, their disks and one FIFO network; `log` collects the transcript lines."""

    def __init__(
        self, node_ids: Iterable[int], *, config: RaftConfig | None = None, bootstrap: bool = True
    ) -> None:
        self.config = config or RaftConfig()
        ids = [NodeId(n) for n in node_ids]
        self.membership = Membership(voters=frozenset(ids))
        self.storages: dict[NodeId, MemoryStorage] = {}
        self.hard_state_stores: dict[NodeId, MemoryHardStateStore] = {}
        self.nodes: dict[NodeId, RaftNode] = {}
        self.applied: dict[NodeId, list[Entry]] = {}
        self.read_states: dict[NodeId, list[ReadState]] = {}
        self.bootstraps: dict[NodeId, Membership | None] = {}
        self.queue: deque[Message] = deque()
        self.cut: set[tuple[NodeId, NodeId]] = set()
        self.log: list[str] = []
        self.history: list[Message] = []  # every message sent (delivered or not), for tests
        for node_id in ids:
            self.add_node(node_id, membership=self.membership if bootstrap else None)

    # --- nodes ---

    def add_node(self, node_id: NodeId, *, membership: Membership | None = None) -> RaftNode:
        assert node_id not in self.nodes, node_id
        self.storages[node_id] = MemoryStorage()
        self.hard_state_stores[node_id] = MemoryHardStateStore()
        self.bootstraps[node_id] = membership
        self.start(node_id, membership)
        return self.nodes[node_id]

    def start(self, node_id: NodeId, membership: Membership | None) -> None:
        self.applied[node_id] = []
        self.read_states[node_id] = []
        self.nodes[node_id] = RaftNode(
            node_id=node_id,
            config=self.config,
            storage=self.storages[node_id],
            hard_state=self.hard_state_stores[node_id].load(),
            rng=random.Random(node_id),
            bootstrap_membership=membership,
        )

    def crash(self, node_id: NodeId) -> None:
        del self.nodes[node_id]
        self.storages[node_id].crash()
        self.queue = deque(m for m in self.queue if node_id not in (m.sender, m.receiver))

    def restart(self, node_id: NodeId) -> None:
        assert node_id not in self.nodes, f"node {node_id} is running"
        self.start(node_id, self.bootstraps[node_id])

    def compact(self, node_id: NodeId, offset: Offset) -> None:
        """What a driver does after applying: snapshot at `offset` and drop the prefix."""
        node = self.nodes[node_id]
        assert offset <= node.log.durable_last_offset() and offset <= node.applied, offset
        term = node.log.term_at(offset)
        assert term is not None, offset
        meta = SnapshotMeta(
            offset=offset, term=term, membership=self._membership_at(node_id, offset)
        )
        self.storages[node_id].compact(Snapshot(meta))

    def _membership_at(self, node_id: NodeId, offset: Offset) -> Membership:
        """The membership in force at `offset`: the last CONFIG entry at or before it."""
        bootstrap = self.bootstraps[node_id] or Membership(voters=frozenset())
        membership = membership_at(self.storages[node_id], offset, bootstrap)
        assert membership.voters, f"node {node_id} has no membership at {offset}"
        return membership

    # --- network ---

    def send(self, message: Message) -> None:
        self.history.append(message)
        link = (message.sender, message.receiver)
        if link in self.cut or message.receiver not in self.nodes:
            self.log.append(f"  dropped {format_message(message)}")
            return
        self.log.append(f"  {format_message(message)}")
        self.queue.append(message)

    def deliver(self, link: tuple[NodeId, NodeId] | None = None) -> int:
        """Deliver what is queued now (on `link` only, if given); answers wait."""
        batch = [m for m in self.queue if link is None or (m.sender, m.receiver) == link]
        self.queue = deque(m for m in self.queue if m not in batch)
        for message in batch:
            if (
                message.receiver in self.nodes
                and (message.sender, message.receiver) not in self.cut
            ):
                self.nodes[message.receiver].step(message)
        return len(batch)

    def drop(self, link: tuple[NodeId, NodeId] | None = None) -> int:
        kept = deque(m for m in self.queue if link is not None and (m.sender, m.receiver) != link)
        dropped = len(self.queue) - len(kept)
        self.queue = kept
        return dropped

    def partition(self, groups: list[set[NodeId]]) -> None:
        """Cut every link between the groups (replacing earlier cuts)."""
        self.cut.clear()
        for group in groups:
            for other in groups:
                if other is not group:
                    self.cut.update((a, b) for a in group for b in other)

    # --- ready processing ---

    def process(self) -> bool:
        """Process one Ready of every node that has one; True if any did."""
        processed = False
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            if node.has_ready():
                self._process_node(node_id, node)
                processed = True
        return processed

    def _process_node(self, node_id: NodeId, node: RaftNode) -> None:
        def restore(snapshot: Snapshot) -> None:
            self.log.append(
                f"  {node_id}: restore snapshot {snapshot.meta.offset}@{snapshot.meta.term}"
            )

        def on_read(read_state: ReadState) -> None:
            self.read_states[node_id].append(read_state)
            self.log.append(
                f"  {node_id}: read {read_state.request_id} at {read_state.commit_offset}"
            )

        def apply(entry: Entry) -> None:
            self.applied[node_id].append(entry)

        ready = process_ready(
            node,
            log=self.storages[node_id],
            hard_state_store=self.hard_state_stores[node_id],
            send=self.send,
            apply=apply,
            restore=restore,
            on_read=on_read,
        )
        if ready.soft_state is not None:
            soft = ready.soft_state
            leader = "none" if soft.leader_id is None else soft.leader_id
            self.log.append(f"  {node_id}: {soft.role.value} term={soft.term} leader={leader}")
        if ready.committed_entries:
            first, last = ready.committed_entries[0], ready.committed_entries[-1]
            self.log.append(f"  {node_id}: apply {first.offset}..{last.last_offset}")

    def stabilize(self) -> None:
        for _ in range(STABILIZE_ROUNDS_MAX):
            processed = self.process()
            if not self.deliver() and not processed:
                return
        raise AssertionError("cluster did not stabilize")

    # --- views ---

    def leader(self) -> RaftNode | None:
        leaders = [n for n in self.nodes.values() if n.role is Role.LEADER]
        return max(leaders, key=lambda n: n.term) if leaders else None

    def status_lines(self) -> list[str]:
        lines = []
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            leader = "none" if node.leader_id is None else node.leader_id
            membership = node.membership
            lines.append(
                f"  {node_id}: {node.role.value} term={node.term} leader={leader} "
                f"commit={node.commit_offset} applied={node.applied} last={node.last_offset} "
                f"first={node.log.first_offset()} v={_ids(membership.voters)} "
                f"l={_ids(membership.learners)}"
            )
            for peer in sorted(node.progress):
                if peer != node_id:
                    progress = node.progress[peer]
                    lines.append(
                        f"    {peer}: {progress.state.value} match={progress.match} "
                        f"next={progress.next} inflight={len(progress.inflights)}"
                    )
        return lines

    # --- the script language ---

    def run(self, command: str) -> list[str]:
        """Run one script command; returns its transcript lines."""
        self.log = []
        words = command.split()
        try:
            self._dispatch(words[0], words[1:])
        except RaftError as error:
            self.log.append(f"  error: {type(error).__name__}: {error}")
        while self.process():
            pass
        return self.log or ["  ok"]

    def _dispatch(self, verb: str, args: list[str]) -> None:
        if verb in ("campaign", "propose", "propose-membership", "transfer", "read-index"):
            self._dispatch_node(verb, self.nodes[NodeId(int(args[0]))], args[1:])
            return
        match verb:
            case "add-node":
                self.add_node(NodeId(int(args[0])))
            case "compact":
                self.compact(NodeId(int(args[0])), Offset(int(args[1])))
            case "partition":
                groups = " ".join(args).split("|")
                self.partition([{NodeId(int(n)) for n in g.split()} for g in groups])
            case "heal":
                self.cut.clear()
            case "deliver":
                self.deliver(_parse_link(args[0]) if args else None)
            case "drop":
                self.log.append(f"  dropped {self.drop(_parse_link(args[0]) if args else None)}")
            case "tick":
                self._tick(args)
            case "stabilize":
                self.stabilize()
            case "status":
                self.log.extend(self.status_lines())
            case "crash":
                self.crash(NodeId(int(args[0])))
            case "restart":
                self.restart(NodeId(int(args[0])))
            case _:
                raise ValueError(f"unknown command {verb!r}")

    def _dispatch_node(self, verb: str, node: RaftNode, args: list[str]) -> None:
        """Commands addressed to one node's API."""
        match verb:
            case "campaign":
                node.campaign()
            case "propose":
                count = int(args[1]) if len(args) > 1 else 1
                self.log.append(
                    f"  proposed at {node.propose(args[0].encode(), offset_count=count)}"
                )
            case "propose-membership":
                learners = _parse_ids(args[1]) if len(args) > 1 else frozenset()
                offset = node.propose_membership(Membership(_parse_ids(args[0]), learners))
                self.log.append(f"  proposed at {offset}")
            case "transfer":
                node.transfer_leadership(NodeId(int(args[0])))
            case "read-index":
                node.read_index(int(args[0]))

    def _tick(self, args: list[str]) -> None:
        times = int(args[1].lstrip("x")) if len(args) > 1 else 1
        targets = sorted(self.nodes) if args[0] == "all" else [NodeId(int(args[0]))]
        for _ in range(times):
            for target in targets:
                self.nodes[target].tick()
            while self.process():
                pass


def _parse_ids(text: str) -> frozenset[NodeId]:
    return frozenset(NodeId(int(n)) for n in text.split(","))


def _parse_link(text: str) -> tuple[NodeId, NodeId]:
    sender, receiver = text.split("->")
    return NodeId(int(sender)), NodeId(int(receiver))
