"""The client's token header is the one the server's interceptor reads (the client writes it
without importing the server's security module)."""

from __future__ import annotations

import grpc
import pytest

from raftlog.client._auth import bearer_metadata
from raftlog.rpc import security


@pytest.mark.parametrize("token", [None, "alice-token-0123456789", "t" * 64])
def test_the_client_header_is_the_servers(token: str | None) -> None:
    assert bearer_metadata(token) == security.bearer_metadata(token)


def test_the_server_reads_the_token_the_client_sends() -> None:
    class _Details(grpc.HandlerCallDetails):  # type: ignore[misc]
        method = "/raftlog.v1.Log/Fetch"
        invocation_metadata = bearer_metadata("alice-token-0123456789")

    assert security._bearer(_Details()) == "alice-token-0123456789"
