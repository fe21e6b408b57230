"""SASL/PLAIN on the Kafka listener, with raftlog's tokens and per-topic permissions.

With a token file (`--auth-tokens`, `raftlog.rpc.security`), a Kafka connection must first
authenticate: SaslHandshake (v1, mechanism PLAIN), then SaslAuthenticate whose PLAIN
password is a raftlog token (the user name is informational: the token names the
principal). Until then only ApiVersions and the two SASL requests are served; anything
else closes the connection, and so does a failed authentication (as Kafka does). After it,
each handler checks the principal's permission on every topic it touches, with the same
grants as the gRPC API: write to produce, read to fetch, list offsets, commit or fetch
group offsets, join a KIP-848 group (every subscribed topic) and describe, admin to create,
grow or delete topics; a refused topic or partition gets TOPIC_AUTHORIZATION_FAILED and the
others proceed. Without a token file
every connection is the principal `anonymous` with every permission, as on gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from raftlog.rpc.kafka.schema import build, response_module
from raftlog.rpc.security import AccessControl, Permission

__all__ = [
    "ANONYMOUS",
    "SASL_AUTHENTICATE",
    "SASL_HANDSHAKE",
    "Session",
    "sasl_authenticate",
    "sasl_handshake",
]

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
ANONYMOUS = "anonymous"
_MECHANISM = "PLAIN"


@dataclass(slots=True)
class Session:
    """One connection's authentication: its principal, None until it authenticated."""

    access: AccessControl | None
    principal: str | None = None
    mechanism_chosen: bool = False

    def __post_init__(self) -> None:
        if self.access is None:
            self.principal = ANONYMOUS

    def allowed(self, permission: Permission, topic: str) -> bool:
        """Whether the session may use `permission` on `topic`: always without a token file, never
        before authenticating, else as the token file grants the principal."""
        if self.access is None:
            return True
        return self.principal is not None and self.access.allowed(self.principal, permission, topic)


async def sasl_handshake(ctx: Any, request: Any, version: int) -> Any:
    """SaslHandshake v1: picks PLAIN for the connection's next SaslAuthenticate. Answers
    UNSUPPORTED_SASL_MECHANISM for any other mechanism or when the listener has no token file (then
    listing no mechanisms); never reaches the node port."""
    module = response_module(SASL_HANDSHAKE, version)
    session: Session = ctx.session
    known = request.mechanism == _MECHANISM and session.access is not None
    session.mechanism_chosen = known
    return build(
        module.SaslHandshakeResponse,
        error_code=ErrorCode.none if known else ErrorCode.unsupported_sasl_mechanism,
        mechanisms=(_MECHANISM,) if session.access is not None else (),
    )


async def sasl_authenticate(ctx: Any, request: Any, version: int) -> Any:
    """PLAIN: authzid NUL user NUL password, the password a raftlog token (RFC 4616)."""
    module = response_module(SASL_AUTHENTICATE, version)
    session: Session = ctx.session
    principal = None
    if session.access is not None and session.mechanism_chosen:
        parts = bytes(request.auth_bytes).split(b"\x00")
        if len(parts) == 3:
            try:
                principal = session.access.authenticate(parts[2].decode("utf-8"))
            except UnicodeDecodeError:
                principal = None
    if principal is None:
        return build(
            module.SaslAuthenticateResponse,
            error_code=ErrorCode.sasl_authentication_failed,
            error_message="authentication failed: PLAIN with a raftlog token as the password",
            auth_bytes=b"",
            session_lifetime=_NO_LIFETIME,
        )
    session.principal = principal
    return build(
        module.SaslAuthenticateResponse,
        error_code=ErrorCode.none,
        error_message=None,
        auth_bytes=b"",
        session_lifetime=_NO_LIFETIME,
    )


def _no_lifetime() -> Any:
    import datetime

    from kio.static.primitive import i64Timedelta

    return i64Timedelta.parse(datetime.timedelta(0))


_NO_LIFETIME = _no_lifetime()
