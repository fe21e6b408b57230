"""The bearer token a client sends on every call (docs/security.md).

The header's shape is the server's contract (`raftlog.rpc.security` reads it); the client
writes it here so that it imports no server module.
"""

from __future__ import annotations

__all__ = ["AUTHORIZATION_KEY", "bearer_metadata"]

AUTHORIZATION_KEY = "authorization"
_BEARER = "Bearer "


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries `token` (empty without one)."""
    return () if token is None else ((AUTHORIZATION_KEY, _BEARER + token),)
