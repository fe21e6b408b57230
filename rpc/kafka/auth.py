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

The same grants answer a client that asks for its authorized operations (Metadata,
DescribeCluster; KIP-430) as Kafka's bit sets (bit n: AclOperation n allowed): on a topic,
`read` allows READ, DESCRIBE and DESCRIBE_CONFIGS (what those handlers check), `write`
WRITE, `admin` CREATE, DELETE, ALTER and ALTER_CONFIGS; on the cluster, every principal
DESCRIBE, DESCRIBE_CONFIGS and IDEMPOTENT_WRITE, `admin` on every topic (a "*" grant)
CREATE, and `cluster` CLUSTER_ACTION, ALTER and ALTER_CONFIGS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from raftlog.rpc.kafka.schema import build, response_module
from raftlog.rpc.security import AccessControl, Permission

__all__ = [
    "ANONYMOUS",
    "OPERATIONS_NOT_ASKED",
    "SASL_AUTHENTICATE",
    "SASL_HANDSHAKE",
    "Session",
    "sasl_authenticate",
    "sasl_handshake",
]

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
ANONYMOUS = "anonymous"
_MECHANISM = "PLAIN"
# Kafka's "not asked" value of an authorized-operations field (KIP-430).
OPERATIONS_NOT_ASKED = -(2**31)
# Kafka's AclOperation codes.
_READ, _WRITE, _CREATE, _DELETE, _ALTER, _DESCRIBE = 3, 4, 5, 6, 7, 8
_CLUSTER_ACTION, _DESCRIBE_CONFIGS, _ALTER_CONFIGS, _IDEMPOTENT_WRITE = 9, 10, 11, 12
# The operations Kafka defines on a topic, and the permission each needs on this listener.
_TOPIC_OPERATIONS: dict[int, Permission] = {
    _READ: Permission.READ,
    _WRITE: Permission.WRITE,
    _CREATE: Permission.ADMIN,
    _DELETE: Permission.ADMIN,
    _ALTER: Permission.ADMIN,
    _DESCRIBE: Permission.READ,
    _DESCRIBE_CONFIGS: Permission.READ,
    _ALTER_CONFIGS: Permission.ADMIN,
}
# The operations Kafka defines on the cluster: None needs only authentication; a permission
# is asked on the topic name "", which only a "*" grant matches (every topic, the cluster).
_CLUSTER_OPERATIONS: dict[int, Permission | None] = {
    _DESCRIBE: None,
    _DESCRIBE_CONFIGS: None,
    _IDEMPOTENT_WRITE: None,
    _CREATE: Permission.ADMIN,
    _CLUSTER_ACTION: Permission.CLUSTER,
    _ALTER: Permission.CLUSTER,
    _ALTER_CONFIGS: Permission.CLUSTER,
}


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

    def topic_operations(self, topic: str) -> int:
        """Kafka's bit set of the operations the session may do on `topic` (module docstring)."""
        return sum(1 << op for op, needs in _TOPIC_OPERATIONS.items() if self.allowed(needs, topic))

    def cluster_operations(self) -> int:
        """Kafka's bit set of the operations the session may do on the cluster."""
        return sum(
            1 << op
            for op, needs in _CLUSTER_OPERATIONS.items()
            if self.principal is not None and (needs is None or self.allowed(needs, ""))
        )


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
