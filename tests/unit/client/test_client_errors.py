"""The client's error messages stay readable however often a request was retried."""

from __future__ import annotations

from raftlog.client.errors import ClientError, ConnectionFailedError, NoNodeAnsweredError


def test_no_node_answered_names_each_distinct_failure_once_with_its_count() -> None:
    refused: list[ClientError] = [
        ConnectionFailedError(address, "Connection refused")
        for _ in range(200)
        for address in ("127.0.0.1:1", "127.0.0.1:2")
    ]
    refused.append(ConnectionFailedError("127.0.0.1:3", "TLS handshake failed"))
    error = NoNodeAnsweredError("describe cluster", refused, addresses=["127.0.0.1:1"])
    assert str(error) == (
        "describe cluster: no node answered: 127.0.0.1:1: Connection refused (200 times); "
        "127.0.0.1:2: Connection refused (200 times); 127.0.0.1:3: TLS handshake failed"
    )
    assert len(error.failures) == 401  # every failure is still there for callers that look


def test_no_node_answered_without_candidates_says_so() -> None:
    error = NoNodeAnsweredError("metadata", [], addresses=[])
    assert str(error) == "metadata: no node answered: no address to try"
