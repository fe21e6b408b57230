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
from raftlog.settings import NodeSettings
from raftlog.types import NodeId


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def test_client_listeners_are_bound_before_any_raft_group_runs(tmp_path: Path) -> None:
    raft, kafka = ("127.0.0.1", _free_port()), ("127.0.0.1", _free_port())
    node = Node(
        NodeSettings(
            node_id=NodeId(1),
            data_dir=tmp_path,
            listen=("127.0.0.1", 0),
            raft_listen=raft,
            peers={NodeId(1): raft},
            kafka_listen=kafka,
        )
    )
    # What the clients find at the moment the group engine starts running groups.
    seen_at_first_pass: list[tuple[bool, bool, int]] = []
    run = node.host.run

    async def run_observed() -> None:
        seen_at_first_pass.append((_accepts(node.bound_port), _accepts(kafka[1]), node.host.passes))
        await run()

    node.host.run = run_observed  # type: ignore[method-assign]

    async def scenario() -> None:
        await node.start()
        try:
            for _ in range(200):  # then the node runs its groups: its passes persist them
                if node.host.passes > 0:
                    break
                await asyncio.sleep(0.05)
            assert node.host.passes > 0
        finally:
            await node.stop()

    asyncio.run(scenario())
    assert seen_at_first_pass == [(True, True, 0)]
