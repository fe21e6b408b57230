"""A node whose certificate is not signed by the cluster's CA cannot join (issue 10).

Nodes 1 and 2 run with the cluster's certificate; node 3 is listed as a voter but holds a
certificate from a foreign CA (and trusts only that CA). Mutual TLS fails in both directions,
so no HELLO ever completes: nodes 1 and 2 form the quorum on their own, node 3 never
registers and never learns who the controller is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.client import Admin
from raftlog.client.errors import NotControllerError
from raftlog.local_cluster import LocalCluster
from tests.security.pki import TOKENS, Pki
from tests.security.test_secure_cluster import wait_for_nodes

OBSERVE_S = 5.0  # how long node 3 gets to (fail to) join: many election timeouts


def flags(cert: Path, key: Path, ca: Path, tokens: Path) -> tuple[str, ...]:
    return ("--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca),
            "--peer-tls", "--auth-tokens", str(tokens))  # fmt: skip


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki, tokens_file: Path
) -> Iterator[LocalCluster]:
    cluster = LocalCluster.create(tmp_path_factory.mktemp("foreign"), node_count=3)
    try:
        for node_id in (1, 2):
            cluster.start_node(node_id, *flags(pki.cert, pki.key, pki.ca, tokens_file))
        foreign = flags(pki.foreign_cert, pki.foreign_key, pki.foreign_ca, tokens_file)
        cluster.start_node(3, *foreign)
        yield cluster
    finally:
        cluster.stop()


def test_a_node_with_a_foreign_certificate_cannot_join(cluster: LocalCluster, pki: Pki) -> None:
    ours = ",".join(cluster.nodes[n].client_address for n in (1, 2))
    wait_for_nodes(ours, pki.ca, 2, timeout_s=60)
    with Admin(ours, tls_ca=pki.ca, token=TOKENS["admin"]) as admin:
        admin.create_topic("pair", partitions=1, replication_factor=2)
        time.sleep(OBSERVE_S)  # integration test: give node 3 every chance to get in
        members = {node.node_id for node in admin.describe_cluster().nodes}
        replicas = admin.describe_topic("pair").partitions[0].replicas
    assert members == {1, 2} and 3 not in replicas
    assert cluster.is_running(3)  # it is up, just shut out
    # Node 3's own view (it trusts only the foreign CA): it never heard from a leader, so it
    # never applied its own registration, never caught up with the metadata quorum, and
    # refuses to describe the cluster from its copy (raftlog.metadata.catch_up).
    third = cluster.nodes[3].client_address
    admin = Admin(third, tls_ca=pki.foreign_ca, token=TOKENS["admin"], request_timeout_ms=5000)
    with admin, pytest.raises(NotControllerError, match="has not caught up") as refused:
        admin.describe_cluster()
    assert refused.value.leader_id is None  # it knows no controller
