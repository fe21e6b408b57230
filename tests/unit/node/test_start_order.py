"""A node binds its client listeners before any of its Raft groups runs.

A group that runs can win an election, and the metadata then names the node its leader: a
client told so must reach the node (and be answered, or refused retriably while it catches
up), never find its port closed. A restarted node refused a producer's connection in exactly
that window (`test_compaction`'s keyed topic, created right after a restart, was led by the
restarted node before its gRPC server listened).
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from raftlog.node.node import Node
from raftlog.raft.types import Role
from raftlog.settings import NodeSettings
from raftlog.types import NodeId


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_client_listeners_are_bound_before_any_raft_group_runs(tmp_path: Path) -> None:
    raft = ("127.0.0.1", _free_port())
    node = Node(
        NodeSettings(
            node_id=NodeId(1),
            data_dir=tmp_path,
            listen=("127.0.0.1", 0),
            raft_listen=raft,
            peers={NodeId(1): raft},
        )
    )
    passes_seen: list[int] = []

    async def front_ends() -> None:
        # The gRPC listener takes connections, and no group has run a pass: nothing the
        # node's groups did (a sole voter's campaign, in memory) has been persisted, sent or
        # reported, so no election could have named this node yet.
        with socket.create_connection(("127.0.0.1", node.bound_port), timeout=5):
            pass
        await asyncio.sleep(0.5)  # a running host passes every tick
        passes_seen.append(node.host.passes)

    async def scenario() -> None:
        await node.start(start_front_ends=front_ends)
        try:
            assert node.metadata_group is not None
            for _ in range(200):  # then the node runs its groups and elects itself
                if node.metadata_group.node.role is Role.LEADER:
                    break
                await asyncio.sleep(0.05)
            assert node.metadata_group.node.role is Role.LEADER
        finally:
            await node.stop()

    asyncio.run(scenario())
    assert passes_seen == [0]
