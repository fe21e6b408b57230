"""A node holds metadata reads until its copy has caught up since it started, then refuses
them retriably (raftlog.metadata.catch_up, Node.wait_metadata_caught_up and the servicers'
`metadata_read_refusal`)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, cast

from raftlog.config import MetadataConfig, NodeConfig
from raftlog.metadata import RegisterNode, encode_command
from raftlog.node.node import Node
from raftlog.raft.types import Entry, EntryKind
from raftlog.rpc.admin_servicer import metadata_read_refusal
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.settings import NodeSettings
from raftlog.types import NodeId, Offset, Term

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from typing import Any


def _node(data_dir: Path, *, catch_up_wait_ms: int = 3000) -> Node:
    address = ("127.0.0.1", 1)
    config = dataclasses.replace(
        NodeConfig(), metadata=MetadataConfig(catch_up_wait_ms=catch_up_wait_ms)
    )
    return Node(
        NodeSettings(
            node_id=NodeId(1),
            data_dir=data_dir,
            listen=address,
            raft_listen=address,
            peers={NodeId(1): address},
            config=config,
        )
    )


def _apply_registration(node: Node, incarnation: int) -> None:
    """Apply node 1's registration of `incarnation` to the broker's copy, as the metadata
    group's apply does."""
    command = RegisterNode(NodeId(1), "127.0.0.1:1", "127.0.0.1:1", incarnation, 0)
    offset = Offset(node.metadata.state.applied_offset + 1)
    node.metadata.apply(Entry(Term(1), offset, 1, EntryKind.DATA, encode_command(command)))


def _run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coroutine)


def test_reads_wait_until_the_copy_shows_this_start_s_registration(tmp_path: Path) -> None:
    node = _node(tmp_path)

    async def scenario() -> None:
        waiting = asyncio.ensure_future(node.api.wait_metadata_caught_up())
        await asyncio.sleep(0)
        _apply_registration(node, node.incarnation - 1)  # the previous start's
        await asyncio.sleep(0)
        assert not waiting.done()
        _apply_registration(node, node.incarnation)
        assert await waiting is True
        assert await node.api.wait_metadata_caught_up() is True  # latched for this start

    _run(scenario())


def test_a_read_that_waited_out_the_bound_is_told_so(tmp_path: Path) -> None:
    node = _node(tmp_path, catch_up_wait_ms=1)

    async def scenario() -> None:
        assert await node.api.wait_metadata_caught_up() is False

    _run(scenario())


class _Node:
    """What `metadata_read_refusal` reads of a node: node 3, not caught up, controller 1."""

    node_id = NodeId(3)

    def __init__(self, *, caught_up: bool, controller: NodeId | None) -> None:
        self.caught_up = caught_up
        self.controller_id = controller

    async def wait_metadata_caught_up(self) -> bool:
        return self.caught_up

    def leader_address(self, leader_id: int | None) -> str:
        return "" if leader_id is None else f"127.0.0.1:{9000 + leader_id}"


def _refusal(node: _Node) -> pb.Error | None:
    return asyncio.run(metadata_read_refusal(cast(Node, node)))


def test_a_caught_up_node_answers() -> None:
    assert _refusal(_Node(caught_up=True, controller=NodeId(1))) is None


def test_a_lagging_node_sends_the_client_to_the_controller() -> None:
    refusal = _refusal(_Node(caught_up=False, controller=NodeId(1)))
    assert refusal is not None
    assert refusal.code == pb.NOT_CONTROLLER and refusal.retriable
    assert (refusal.leader_id, refusal.leader_address) == (1, "127.0.0.1:9001")
    assert "node 3 has not caught up with the metadata quorum" in refusal.message


def test_a_lagging_node_that_knows_no_controller_names_none() -> None:
    refusal = _refusal(_Node(caught_up=False, controller=None))
    assert refusal is not None
    assert refusal.retriable and (refusal.leader_id, refusal.leader_address) == (-1, "")
