"""Client authentication, per-topic permissions and per-client limits on the gRPC API.

Theory of operation. Every unary call to a raftlog service passes through one
`SecurityInterceptor` before its servicer runs, in this order:

1. authenticate: with a token file (`--auth-tokens`), the call must carry the metadata
   `authorization: Bearer <token>`, or, when the node requires client certificates
   (`--tls-client-ca`, mutual TLS), come over a connection whose verified certificate names
   the principal: its CN, or without a CN its first SAN. A token, when sent, wins (it is the
   more specific credential). A missing or unknown credential is UNAUTHENTICATED. Without a
   token file every caller is the principal `anonymous` with every permission;
2. authorize: `METHOD_RULES` names the permission each method needs (read, write, admin,
   cluster) and which topics of the request it concerns; every such topic must be granted,
   else PERMISSION_DENIED naming the principal, the topic and the missing permission;
3. limit: a client (its principal, or its connection when anonymous) may have at most
   `client_requests_in_flight_max` calls in flight, and the node buffers at most
   `produce_buffer_bytes_max` of Produce requests at once; a call over either bound is
   refused at once with RESOURCE_EXHAUSTED (it never queues), so the node stays up and
   other clients are unaffected.

Before all three, connections: a node admits at most `client_connections_per_address_max`
client connections from one IP address and `client_connections_max` in all. gRPC offers no
hook when a connection opens or closes, so a connection is admitted at its first call (the
peer's address and port name it) and counts until the kernel's table of established TCP
connections (/proc/net/tcp, tcp6) no longer holds it; every call of a connection beyond a
cap is RESOURCE_EXHAUSTED naming the cap, while admitted connections carry on. The table is
read only when a connection not yet admitted calls, at most once per
`_CONNECTION_SCAN_INTERVAL_S`; without /proc an admitted connection counts until it has
made no call for `client_connection_idle_ms_max` (when gRPC closes it anyway).

Health checks and reflection stay open (load balancers and grpcurl use them); a non-unary
method of any other service is refused (deny by default).

Token file (TOML):

    [tokens]                    # token -> principal
    "4f9c...e1" = "alice"
    "77ab...02" = "node"
    [permissions.alice]         # topic pattern -> permissions; "orders-*" is a prefix
    "orders" = ["read", "write"]
    "*" = ["read"]
    [permissions.node]
    "*" = ["read", "write", "admin", "cluster"]

`cluster` is what nodes need for `Internal` (metadata forwarding); a node uses the first
token whose principal has it. Only SHA-256 digests of tokens are kept in memory, and no
token is ever logged or named in an error.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import inspect
import ipaddress
import logging
import ssl
import time
import tomllib
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import DecodeError

from raftlog.errors import ConfigError
from raftlog.settings import NodeSettings
from raftlog.tls import (
    TlsFiles,
    grpc_channel_credentials,
    grpc_server_credentials,
    peer_ssl_contexts,
)

__all__ = [
    "ANONYMOUS",
    "AUTHORIZATION_KEY",
    "METHOD_RULES",
    "AccessControl",
    "ClientLimits",
    "ConnectionLimits",
    "Permission",
    "Rule",
    "SecurityInterceptor",
    "ServerSecurity",
    "bearer_metadata",
    "certificate_principal",
    "load_access_control",
    "security_peer_ssl",
    "security_server_setup",
]

AUTHORIZATION_KEY = "authorization"
ANONYMOUS = "anonymous"
_BEARER = "Bearer "
_TOKEN_CHARS_MIN = 16
log = logging.getLogger(__name__)
_PUBLIC_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class Permission(enum.Enum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"
    CLUSTER = "cluster"


@dataclass(frozen=True, slots=True)
class Grant:
    """Permissions on a topic pattern: an exact name, or a prefix ending in `*`."""

    pattern: str
    permissions: frozenset[Permission]

    def matches(self, topic: str) -> bool:
        if self.pattern.endswith("*"):
            return topic.startswith(self.pattern[:-1])
        return topic == self.pattern


@dataclass(frozen=True, slots=True)
class AccessControl:
    """Token digests -> principal, and principal -> grants (see the module docstring)."""

    principals_by_digest: dict[bytes, str]
    grants: dict[str, tuple[Grant, ...]]
    node_token: str | None = field(default=None, repr=False)

    def authenticate(self, token: str) -> str | None:
        digest = _digest(token)
        for known, principal in self.principals_by_digest.items():
            if hmac.compare_digest(known, digest):
                return principal
        return None

    def allowed(self, principal: str, permission: Permission, topic: str) -> bool:
        grants = self.grants.get(principal, ())
        return any(g.matches(topic) and permission in g.permissions for g in grants)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def load_access_control(path: Path) -> AccessControl:
    """Parse a token file; errors name the file and key but never a token."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"--auth-tokens {path}: {error}") from None
    if Path(path).stat().st_mode & 0o077:
        # Whoever can read the file can act as any principal in it.
        log.warning("--auth-tokens %s: readable by group or others; chmod 600 it", path)
    unknown = sorted(set(raw) - {"tokens", "permissions"})
    if unknown:
        raise ConfigError(f"--auth-tokens {path}: unknown tables {unknown}")
    principals: dict[bytes, str] = {}
    tokens = _table(raw, "tokens", path)
    for number, (token, principal) in enumerate(tokens.items(), start=1):
        if len(token) < _TOKEN_CHARS_MIN or not isinstance(principal, str) or not principal:
            raise ConfigError(
                f"--auth-tokens {path}: [tokens] entry {number}: the token must have at least "
                f"{_TOKEN_CHARS_MIN} characters and map to a principal name"
            )
        principals[_digest(token)] = principal
    grants = {
        name: _grants(entries, path, name)
        for name, entries in _table(raw, "permissions", path).items()
    }
    node_token = next(
        (
            t
            for t, p in tokens.items()
            if any(Permission.CLUSTER in g.permissions for g in grants.get(p, ()))
        ),
        None,
    )
    assert len(principals) == len(tokens)
    return AccessControl(principals, grants, node_token)


def _table(raw: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    table = raw.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"--auth-tokens {path}: [{name}] must be a table")
    return table


def _grants(entries: object, path: Path, principal: str) -> tuple[Grant, ...]:
    if not isinstance(entries, dict):
        raise ConfigError(f"--auth-tokens {path}: [permissions.{principal}] must be a table")
    grants = []
    for pattern, names in entries.items():
        valid = {p.value for p in Permission}
        if not isinstance(names, list) or not all(isinstance(n, str) and n in valid for n in names):
            raise ConfigError(
                f"--auth-tokens {path}: [permissions.{principal}] {pattern!r}: expected a list "
                f"of {sorted(valid)}, got {names!r}"
            )
        grants.append(Grant(pattern, frozenset(Permission(n) for n in names)))
    return tuple(grants)


# -- which permission each method needs -------------------------------------------------------

Topics = Callable[[Any], Sequence[str]]


@dataclass(frozen=True, slots=True)
class Rule:
    """`permission` on every topic `topics(request)` names; None: authentication only.

    `implied_by` lists permissions that also suffice: as Kafka's Describe is implied by Read,
    Write and Admin, a producer allowed only to write may still look its topic up.
    """

    permission: Permission | None
    topics: Topics
    implied_by: frozenset[Permission] = frozenset()


def _none(request: Any) -> Sequence[str]:
    return ()


def _topic(request: Any) -> Sequence[str]:
    return (request.topic,)


def _name(request: Any) -> Sequence[str]:
    return (request.name,)


def _topics(request: Any) -> Sequence[str]:
    return tuple(request.topics)


def _nested(request: Any, attribute: str) -> Sequence[str]:
    return tuple(item.topic for item in getattr(request, attribute))


# A transactional id is used by a principal granted `write` on `transactional_id:<id>`, as on
# the Kafka listener (rpc/kafka/txn_handlers.py); topics cannot contain ':'.
TRANSACTIONAL_ID_RESOURCE_PREFIX = "transactional_id:"


def _transactional(request: Any, topics: Sequence[str]) -> Sequence[str]:
    """`write` on the request's transactional id (none: authentication only) and `topics`."""
    if not request.transactional_id:
        return topics
    return (TRANSACTIONAL_ID_RESOURCE_PREFIX + request.transactional_id, *topics)


_AUTHENTICATED = Rule(None, _none)
_DESCRIBE = frozenset({Permission.WRITE, Permission.ADMIN})  # besides READ
_CLUSTER = Rule(Permission.CLUSTER, lambda request: ("",))

METHOD_RULES: dict[str, Rule] = {
    "/raftlog.v1.Log/Produce": Rule(Permission.WRITE, _topic),
    "/raftlog.v1.Log/Fetch": Rule(Permission.READ, _topic),
    "/raftlog.v1.Log/ListOffsets": Rule(Permission.READ, _topic),
    "/raftlog.v1.Log/DeleteRecords": Rule(Permission.ADMIN, _topic),
    "/raftlog.v1.Log/Metadata": Rule(Permission.READ, _topics, _DESCRIBE),
    "/raftlog.v1.Log/InitProducerId": Rule(Permission.WRITE, lambda r: _transactional(r, ())),
    "/raftlog.v1.Log/AddPartitionsToTxn": Rule(
        Permission.WRITE, lambda r: _transactional(r, _nested(r, "partitions"))
    ),
    "/raftlog.v1.Log/AddOffsetsToTxn": Rule(Permission.WRITE, lambda r: _transactional(r, ())),
    "/raftlog.v1.Log/TxnOffsetCommit": Rule(Permission.WRITE, lambda r: _transactional(r, ())),
    "/raftlog.v1.Log/EndTxn": Rule(Permission.WRITE, lambda r: _transactional(r, ())),
    "/raftlog.v1.Log/DescribeProducers": Rule(Permission.READ, _topic, _DESCRIBE),
    "/raftlog.v1.Admin/CreateTopic": Rule(Permission.ADMIN, _name),
    "/raftlog.v1.Admin/DeleteTopic": Rule(Permission.ADMIN, _name),
    "/raftlog.v1.Admin/AlterTopicConfig": Rule(Permission.ADMIN, _name),
    "/raftlog.v1.Admin/CreatePartitions": Rule(Permission.ADMIN, _name),
    "/raftlog.v1.Admin/DescribeTopic": Rule(Permission.READ, _name, _DESCRIBE),
    "/raftlog.v1.Admin/ListTopics": _AUTHENTICATED,
    "/raftlog.v1.Admin/DescribeCluster": _AUTHENTICATED,
    "/raftlog.v1.Admin/DecommissionNode": _CLUSTER,  # changes the cluster itself
    # Every transactional id of every principal, and fencing another's producer: operators
    # only (Kafka's abort writes markers, which needs ClusterAction).
    "/raftlog.v1.Admin/ListTransactions": _CLUSTER,
    "/raftlog.v1.Admin/DescribeTransaction": _CLUSTER,
    "/raftlog.v1.Admin/AbortTransaction": _CLUSTER,
    "/raftlog.v1.Internal/SubmitMetadata": _CLUSTER,
    "/raftlog.v1.Internal/SetFaults": _CLUSTER,
    "/raftlog.v1.Groups/ConsumerGroupHeartbeat": Rule(Permission.READ, _topics),
    "/raftlog.v1.Groups/OffsetCommit": Rule(Permission.READ, lambda r: _nested(r, "offsets")),
    "/raftlog.v1.Groups/OffsetFetch": Rule(Permission.READ, lambda r: _nested(r, "partitions")),
    "/raftlog.v1.Groups/LeaveGroup": _AUTHENTICATED,
    "/raftlog.v1.Groups/DeleteGroup": _AUTHENTICATED,
}


# -- limits ---------------------------------------------------------------------------------

PeerKey = tuple[str, int]  # (normalized IP address, port) of a client connection
_CONNECTION_SCAN_INTERVAL_S = 0.05
_TCP_ESTABLISHED = "01"
_PROC_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def peer_key(peer: str) -> PeerKey | None:
    """`("127.0.0.1", 5123)` for gRPC's "ipv4:127.0.0.1:5123" or "ipv6:[::1]:5123" (also
    URL-quoted); None for a peer that is not a TCP address (a Unix socket)."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        return _normalized(ipaddress.ip_address(host.strip("[]"))), int(port)
    except ValueError:
        return None


def _normalized(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    # A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d: one client, one address.
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def established_tcp_peers(tables: Sequence[str] = _PROC_TCP_TABLES) -> set[PeerKey] | None:
    """The remote ends of every established TCP connection of this network namespace, or
    None where the kernel does not publish /proc/net/tcp (then limits fall back on idleness).
    """
    peers: set[PeerKey] = set()
    found = False
    for table in tables:
        try:
            with open(table) as lines:
                next(lines, None)  # the column titles
                for line in lines:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == _TCP_ESTABLISHED:
                        peers.add(_proc_address(fields[2]))
            found = True
        except OSError:
            continue
    return peers if found else None


def _proc_address(text: str) -> PeerKey:
    """/proc/net/tcp's "0100007F:1F90": the address as 32-bit words in host (little-endian)
    order, the port in hex."""
    address, _, port = text.partition(":")
    raw = b"".join(bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8))
    return _normalized(ipaddress.ip_address(raw)), int(port, 16)


class ConnectionLimits:
    """Admitted client connections per IP address and in total (see the module docstring)."""

    def __init__(
        self,
        *,
        per_address_max: int,
        total_max: int,
        idle_ms_max: int,
        established: Callable[[], set[PeerKey] | None] = established_tcp_peers,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert 0 < per_address_max <= total_max and idle_ms_max > 0
        self.per_address_max = per_address_max
        self.total_max = total_max
        self._idle_s_max = idle_ms_max / 1000
        self._established = established
        self._clock = clock
        self._last_scan = float("-inf")
        # gRPC's peer string -> its key and when it last called.
        self.admitted: dict[str, tuple[PeerKey, float]] = {}

    def refusal(self, peer: str) -> str | None:
        """Why a call on connection `peer` must be refused, or None (it is admitted)."""
        now = self._clock()
        known = self.admitted.get(peer)
        if known is not None:
            self.admitted[peer] = (known[0], now)
            return None
        key = peer_key(peer)
        if key is None:
            return None  # not TCP (a Unix socket): local by construction
        self._forget_closed(now)
        same_address = sum(1 for k, _ in self.admitted.values() if k[0] == key[0])
        if same_address >= self.per_address_max:
            return (
                f"{same_address} connections from {key[0]} are open, the most this node "
                f"admits from one address (client_connections_per_address_max="
                f"{self.per_address_max}); close one or reuse a connection"
            )
        if len(self.admitted) >= self.total_max:
            return (
                f"{len(self.admitted)} client connections are open, the most this node admits "
                f"(client_connections_max={self.total_max}); retry later or use another node"
            )
        self.admitted[peer] = (key, now)
        assert len(self.admitted) <= self.total_max
        return None

    def _forget_closed(self, now: float) -> None:
        if now - self._last_scan < _CONNECTION_SCAN_INTERVAL_S:
            return
        self._last_scan = now
        live = self._established()
        for peer, (key, last_call) in list(self.admitted.items()):
            closed = key not in live if live is not None else now - last_call > self._idle_s_max
            if closed:
                del self.admitted[peer]


class ClientLimits:
    """In-flight calls per client and buffered Produce bytes per node (see the docstring)."""

    def __init__(self, *, requests_in_flight_max: int, produce_buffer_bytes_max: int) -> None:
        assert requests_in_flight_max > 0 and produce_buffer_bytes_max > 0
        self.requests_in_flight_max = requests_in_flight_max
        self.produce_buffer_bytes_max = produce_buffer_bytes_max
        self.in_flight: dict[str, int] = {}
        self.produce_bytes = 0

    def refusal(self, client: str, produce_bytes: int) -> str | None:
        """Why a new call of `client` must be refused now, or None (then `acquire` it)."""
        if self.in_flight.get(client, 0) >= self.requests_in_flight_max:
            return (
                f"client {client!r} already has {self.requests_in_flight_max} requests in "
                f"flight (client_requests_in_flight_max); wait for answers before sending more"
            )
        if produce_bytes and self.produce_bytes + produce_bytes > self.produce_buffer_bytes_max:
            return (
                f"this node buffers {self.produce_bytes} bytes of produce requests; "
                f"{produce_bytes} more would exceed produce_buffer_bytes_max="
                f"{self.produce_buffer_bytes_max}; retry later"
            )
        return None

    def acquire(self, client: str, produce_bytes: int) -> None:
        self.in_flight[client] = self.in_flight.get(client, 0) + 1
        self.produce_bytes += produce_bytes
        assert self.in_flight[client] <= self.requests_in_flight_max
        assert self.produce_bytes <= self.produce_buffer_bytes_max

    def release(self, client: str, produce_bytes: int) -> None:
        count = self.in_flight[client] - 1
        if count:
            self.in_flight[client] = count
        else:
            del self.in_flight[client]  # keep the table as small as the set of active clients
        self.produce_bytes -= produce_bytes
        assert self.produce_bytes >= 0 and count >= 0


# -- the interceptor ------------------------------------------------------------------------

# An explicit alias: grpc has no stubs here, and mypy 2 refuses an implicit alias of Any.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
# The stubs make RpcMethodHandler generic; at run time it is not subscriptable.
Handler = Any


class SecurityInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticate, authorize and limit every unary call (module docstring)."""

    def __init__(
        self,
        access: AccessControl | None,
        limits: ClientLimits,
        *,
        certificate_principals: bool = False,
        connections: ConnectionLimits | None = None,
    ) -> None:
        # Certificate principals mean something only where the handshake verified them.
        assert not certificate_principals or access is not None
        self.access = access
        self.limits = limits
        self.certificate_principals = certificate_principals
        self.connections = connections

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        method: str = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(_PUBLIC_PREFIXES):
            return handler
        rule = METHOD_RULES.get(method)
        if rule is None or handler.unary_unary is None:
            return None  # deny by default: UNIMPLEMENTED
        token = _bearer(handler_call_details)
        return grpc.unary_unary_rpc_method_handler(
            self._guarded(method, rule, token, handler),
            # Bytes in: `guarded` parses them itself so that bytes which are not the request
            # message are INVALID_ARGUMENT with the reason, not gRPC's UNKNOWN.
            request_deserializer=None,
            response_serializer=handler.response_serializer,
        )

    def _guarded(
        self, method: str, rule: Rule, token: str | None, handler: Handler
    ) -> Callable[[bytes, Context], Awaitable[Any]]:
        behavior = handler.unary_unary
        parse = handler.request_deserializer

        async def guarded(body: bytes, context: Context) -> Any:
            if self.connections is not None:
                refused = self.connections.refusal(context.peer())
                if refused is not None:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{method}: {refused}")
            principal = await self._authenticate(token, method, context)
            request = await _parsed(parse, body, method, context)
            await self._authorize(principal, method, rule, request, context)
            client = principal if self.access is not None else f"{context.peer()}"
            # The bytes received, counted as received: ByteSize() on a parsed 1 MiB request
            # may serialize it again just to measure it (upb), on the event loop.
            produce_bytes = len(body) if method.endswith("/Produce") else 0
            refusal = self.limits.refusal(client, produce_bytes)
            if refusal is not None:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{method}: {refusal}")
            self.limits.acquire(client, produce_bytes)
            try:
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            finally:
                self.limits.release(client, produce_bytes)

        return guarded

    async def _authenticate(self, token: str | None, method: str, context: Context) -> str:
        if self.access is None:
            return ANONYMOUS
        if token is None and self.certificate_principals:
            principal = certificate_principal(context.auth_context())
            if principal is None:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"{method}: the client certificate names no principal (no CN and no "
                    "subject alternative name) and no token was sent",
                )
            assert principal is not None
            return principal
        if token is None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{method}: no credentials: send metadata '{AUTHORIZATION_KEY}: Bearer <token>' "
                "(client option token=, CLI --token or RAFTLOG_TOKEN)",
            )
        principal = self.access.authenticate(token or "")
        if principal is None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, f"{method}: the token is not valid on this node"
            )
        assert principal is not None
        return principal

    async def _authorize(
        self, principal: str, method: str, rule: Rule, request: Any, context: Context
    ) -> None:
        if self.access is None or rule.permission is None:
            return
        accepted = (rule.permission, *rule.implied_by)
        for topic in rule.topics(request):
            if not any(self.access.allowed(principal, p, topic) for p in accepted):
                what = f"topic {topic!r}" if topic else "the cluster"
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{method}: principal {principal!r} lacks the "
                    f"{rule.permission.value!r} permission on {what}",
                )


async def _parsed(
    parse: Callable[[bytes], Any] | None, body: bytes, method: str, context: Context
) -> Any:
    """The request message of `body`; bytes that do not parse are INVALID_ARGUMENT."""
    if parse is None:
        return body
    try:
        return parse(body)
    except DecodeError as error:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{method}: the {len(body)} request bytes are not a valid request message: {error}",
        )


def certificate_principal(auth_context: dict[str, list[bytes]]) -> str | None:
    """The principal a verified client certificate names: its CN, else its first SAN.

    `auth_context` is gRPC's view of the connection; it holds x509 names only when the
    handshake verified a client certificate against the node's client CA.
    """
    names: list[bytes] = [
        *auth_context.get("x509_common_name", ()),
        *auth_context.get("x509_subject_alternative_name", ()),
    ]
    for name in names:
        if name:
            return name.decode("utf-8", errors="replace")
    return None


def _bearer(details: grpc.HandlerCallDetails) -> str | None:
    metadata = details.invocation_metadata or ()
    for key, value in metadata:
        if key == AUTHORIZATION_KEY and isinstance(value, str) and value.startswith(_BEARER):
            return value[len(_BEARER) :]
    return None


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries `token` (empty without one)."""
    return () if token is None else ((AUTHORIZATION_KEY, _BEARER + token),)


# -- wiring a node (called by raftlog.node.node) -----------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    """What a node's gRPC server needs: credentials, interceptor, options, and what its
    forwarding to the controller dials with (raftlog.rpc.forwarding)."""

    credentials: grpc.ServerCredentials | None
    interceptor: SecurityInterceptor
    options: tuple[tuple[str, int], ...]
    channel_credentials: grpc.ChannelCredentials | None
    node_token: str | None


def security_server_setup(settings: NodeSettings) -> ServerSecurity:
    """TLS credentials, the interceptor and a metadata forwarder that speaks TLS and tokens."""
    config = settings.config
    access = None if settings.auth_tokens is None else load_access_control(settings.auth_tokens)
    files = _tls_files(settings)
    client_ca = settings.tls_client_ca
    credentials = None if files is None else grpc_server_credentials(files, client_ca=client_ca)
    # A node dials other nodes' client API (forwarding to the controller) like a client; where
    # clients must present certificates it presents its own (the client CA must trust it).
    channel_credentials = (
        None
        if files is None
        else grpc_channel_credentials(
            files.ca,
            cert=files.cert if client_ca is not None else None,
            key=files.key if client_ca is not None else None,
        )
    )
    token = None if access is None else access.node_token
    if access is not None and token is None:
        log.warning("--auth-tokens: no principal has 'cluster': forwarding will be refused")

    limits = ClientLimits(
        requests_in_flight_max=config.client_requests_in_flight_max,
        produce_buffer_bytes_max=config.produce_buffer_bytes_max,
    )
    options = (
        ("grpc.max_concurrent_streams", config.client_streams_per_connection_max),
        ("grpc.max_connection_idle_ms", config.client_connection_idle_ms_max),
    )
    connections = ConnectionLimits(
        per_address_max=config.client_connections_per_address_max,
        total_max=config.client_connections_max,
        idle_ms_max=config.client_connection_idle_ms_max,
    )
    interceptor = SecurityInterceptor(
        access,
        limits,
        certificate_principals=client_ca is not None and access is not None,
        connections=connections,
    )
    return ServerSecurity(credentials, interceptor, options, channel_credentials, token)


def security_peer_ssl(
    settings: NodeSettings,
) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """(server, client) ssl contexts for node-to-node traffic; (None, None) in clear."""
    files = _tls_files(settings)
    if not settings.peer_tls or files is None:
        return None, None
    return peer_ssl_contexts(files)


def _tls_files(settings: NodeSettings) -> TlsFiles | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return TlsFiles(cert=settings.tls_cert, key=settings.tls_key, ca=settings.tls_ca).validate()
