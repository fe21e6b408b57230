"""Waiting for metadata to spread, for the integration tests.

Every node answers metadata reads from its own copy, which may lag the controller's by a few
entries (a node that has just started answers only once its copy has caught up,
raftlog.metadata.catch_up). So a test that reads a change through a node other than the one
that made it waits until the node it asks shows the change; it never reads a change through
one node and assumes another has it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster
from tests.integration.conftest import wait_until

__all__ = ["ask_every_node", "wait_every_node_shows", "wait_listed"]

T = TypeVar("T")


def ask_every_node(cluster: LocalCluster, ask: Callable[[Admin], T]) -> Iterator[T]:
    """`ask` each node of `cluster` in turn, each through its own address alone (so no other
    node can answer for it)."""
    for node in cluster.nodes.values():
        with Admin(node.client_address) as admin:
            yield ask(admin)


def wait_every_node_shows(
    cluster: LocalCluster, shows: Callable[[Admin], bool], *, timeout_s: float, what: str
) -> None:
    """Wait until `shows` holds on every node of `cluster`, each asked alone."""
    wait_until(lambda: all(ask_every_node(cluster, shows)), timeout_s=timeout_s, what=what)


def wait_listed(admin: Admin, topic: str, *, timeout_s: float, what: str) -> None:
    """Wait until the node(s) `admin` asks list `topic`."""
    wait_until(lambda: topic in admin.list_topics(), timeout_s=timeout_s, what=what)
