"""How one node is started: identity, addresses, peers, data directory (CLI flags or TOML).

`--peers` lists the initial voters of the metadata quorum as `ID=HOST:PORT` with their
node-to-node (Raft) addresses; clients use `--listen`/`--advertise` (gRPC). A node whose id
is not in `--peers` is an observer: it registers with the controller through `--bootstrap`
(client addresses of the voters, as a KRaft broker finds its controllers through
`controller.quorum.bootstrap.servers`), then follows the metadata quorum as a learner and
hosts partition replicas like any node. Every setting is validated eagerly and errors name
the flag or key.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftlog.config import NodeConfig
from raftlog.errors import ConfigError
from raftlog.types import NodeId

__all__ = [
    "Address",
    "NodeSettings",
    "apply_overrides",
    "parse_address",
    "parse_bootstrap",
    "parse_peers",
    "settings_from_toml",
]

Address = tuple[str, int]


def parse_address(text: str, *, setting: str) -> Address:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{setting}: expected HOST:PORT with a port in [0, 65535], got {text!r}")
    return host, int(port)


def parse_peers(text: str, *, setting: str = "--peers") -> dict[NodeId, Address]:
    peers: dict[NodeId, Address] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node, sep, address = item.partition("=")
        if not sep or not node.isdigit():
            raise ConfigError(f"{setting}: expected ID=HOST:PORT, got {item!r}")
        node_id = NodeId(int(node))
        if node_id in peers:
            raise ConfigError(f"{setting}: node {node_id} is listed twice")
        peers[node_id] = parse_address(address, setting=f"{setting} ({item})")
    if not peers:
        raise ConfigError(f"{setting}: at least one voter is required")
    return peers


def parse_bootstrap(text: str, *, setting: str = "--bootstrap") -> tuple[str, ...]:
    """`HOST:PORT,...` client addresses, each checked, in the given order."""
    addresses = tuple(filter(None, (part.strip() for part in text.split(","))))
    if not addresses:
        raise ConfigError(f"{setting}: expected HOST:PORT,... (client addresses), got {text!r}")
    for address in addresses:
        parse_address(address, setting=setting)
    return addresses


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSettings:
    node_id: NodeId
    data_dir: Path
    listen: Address
    raft_listen: Address
    peers: dict[NodeId, Address]
    advertise: Address | None = None
    raft_advertise: Address | None = None
    cluster_id: str = "raftlog"
    chaos: bool = False
    # Chaos suite only: a deliberately unsafe node that never fsyncs, so a run can
    # show the checker catches the writes such a node loses.
    chaos_skip_fsync: bool = False
    config: NodeConfig = field(default_factory=NodeConfig)
    # Client addresses (HOST:PORT) through which an observer (a node outside `peers`)
    # reaches the controller to register before it follows the metadata quorum.
    bootstrap: tuple[str, ...] = ()
    # Security settings (raftlog.tls, raftlog.rpc.security).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    peer_tls: bool = False
    auth_tokens: Path | None = None
    # Mutual TLS for clients: certificates signed by this CA authenticate their CN or SAN.
    tls_client_ca: Path | None = None
    # Prometheus metrics over HTTP (raftlog.metrics, docs/metrics.md); None: not served.
    metrics_listen: Address | None = None
    # The Kafka wire-protocol listener (raftlog.rpc.kafka): off unless kafka_listen is set;
    # clients are told kafka_advertise (Kafka's advertised.listeners), else kafka_listen.
    kafka_listen: Address | None = None
    kafka_advertise: Address | None = None

    def validate(self) -> NodeSettings:
        if self.node_id < 0:
            raise ConfigError(f"node_id: must be >= 0, got {self.node_id}")
        if not self.cluster_id or len(self.cluster_id) > 128:
            raise ConfigError("cluster_id: must be 1 to 128 characters")
        if len(self.peers) not in (1, 3, 5, 7):
            raise ConfigError(
                f"peers: the metadata quorum takes 1, 3, 5 or 7 voters, got {len(self.peers)}"
            )
        self.config.validate()
        if self.node_id not in self.peers and not self.bootstrap:
            raise ConfigError(
                f"bootstrap (--bootstrap): node {self.node_id} is not a voter in peers "
                f"{sorted(self.peers)}, so it joins as an observer and needs the client "
                "addresses (HOST:PORT,...) of the voters to register with the controller"
            )
        if self.chaos_skip_fsync and not self.chaos:
            raise ConfigError("chaos_skip_fsync (--chaos-skip-fsync) needs chaos (--chaos)")
        # TLS and token settings that need one another.
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert and tls_key (--tls-cert, --tls-key) go together")
        if self.peer_tls and (self.tls_cert is None or self.tls_ca is None):
            raise ConfigError("peer_tls (--peer-tls) needs tls_cert, tls_key and tls_ca")
        if self.tls_client_ca is not None and (self.tls_cert is None or self.auth_tokens is None):
            raise ConfigError(
                "tls_client_ca (--tls-client-ca) needs tls_cert, tls_key (the node's own TLS) "
                "and auth_tokens (--auth-tokens: its [permissions] grant certificate principals)"
            )
        if self.kafka_advertise is not None and self.kafka_listen is None:
            raise ConfigError("kafka_advertise (--kafka-advertise) needs kafka_listen")
        return self

    @property
    def client_address(self) -> str:
        host, port = self.advertise or self.listen
        return f"{host}:{port}"

    @property
    def kafka_address(self) -> str:
        """Where Kafka clients reach this node; "" when it runs no Kafka listener."""
        address = self.kafka_advertise or self.kafka_listen
        return "" if address is None else f"{address[0]}:{address[1]}"

    @property
    def raft_address(self) -> str:
        host, port = self.raft_advertise or self.peers.get(self.node_id) or self.raft_listen
        return f"{host}:{port}"


def apply_overrides(config: NodeConfig, items: list[str]) -> NodeConfig:
    """Apply `--set SECTION.FIELD=VALUE` (or `FIELD=VALUE` for NodeConfig's own fields)."""
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set: expected KEY=VALUE, got {item!r}")
        section_name, dot, field_name = key.rpartition(".")
        # Only a NodeConfig field names a section; getattr would also reach its methods.
        sections = {f.name for f in dataclasses.fields(config)}
        target = getattr(config, section_name) if dot and section_name in sections else config
        if dot and (section_name not in sections or not dataclasses.is_dataclass(target)):
            raise ConfigError(f"--set {key}: unknown section {section_name!r}")
        known = {f.name: f for f in dataclasses.fields(target)}
        if field_name not in known or dataclasses.is_dataclass(getattr(target, field_name)):
            raise ConfigError(f"--set {key}: unknown setting; known: {sorted(known)}")
        current = getattr(target, field_name)
        value = _parse_value(key, text, current)
        updated: Any = dataclasses.replace(target, **{field_name: value})
        if dot:
            updated = dataclasses.replace(config, **{section_name: updated})
        config = updated
    return config.validate()


def _parse_value(key: str, text: str, current: object) -> object:
    if isinstance(current, bool):
        if text not in ("true", "false"):
            raise ConfigError(f"--set {key}: expected true or false, got {text!r}")
        return text == "true"
    if isinstance(current, str):
        return text  # a named choice (log.produce_record_validation): validate() checks it
    if text == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--set {key}: expected an integer, got {text!r}") from None


def settings_from_toml(path: Path, **overrides: Any) -> NodeSettings:
    """Read `[node]` settings from a TOML file; keyword overrides win (from CLI flags)."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"--config {path}: {error}") from error
    node = dict(raw.get("node", {}))
    node.update({k: v for k, v in overrides.items() if v is not None})
    known = {
        "node_id",
        "data_dir",
        "listen",
        "raft_listen",
        "peers",
        "advertise",
        "raft_advertise",
        "cluster_id",
        "chaos",
        "bootstrap",
        "kafka_listen",
        "kafka_advertise",
        *_SECURITY_KEYS,
        "metrics_listen",
    }
    unknown = sorted(set(node) - known)
    if unknown:
        raise ConfigError(f"--config {path}: unknown keys in [node]: {unknown}")
    for required in ("node_id", "data_dir", "listen", "peers"):
        if required not in node:
            raise ConfigError(f"--config {path}: [node] {required} is required")
    listen = parse_address(str(node["listen"]), setting="listen")
    return NodeSettings(
        node_id=NodeId(int(node["node_id"])),
        data_dir=Path(node["data_dir"]),
        listen=listen,
        raft_listen=parse_address(
            str(node.get("raft_listen", f"{listen[0]}:{listen[1] + 100}")), setting="raft_listen"
        ),
        peers=parse_peers(str(node["peers"]), setting="peers"),
        advertise=parse_address(str(node["advertise"]), setting="advertise")
        if node.get("advertise")
        else None,
        raft_advertise=parse_address(str(node["raft_advertise"]), setting="raft_advertise")
        if node.get("raft_advertise")
        else None,
        cluster_id=str(node.get("cluster_id", "raftlog")),
        chaos=bool(node.get("chaos", False)),
        bootstrap=parse_bootstrap(str(node["bootstrap"]), setting="bootstrap")
        if node.get("bootstrap")
        else (),
        **_security_settings(node),
        **_kafka_settings(node),
        metrics_listen=parse_address(str(node["metrics_listen"]), setting="metrics_listen")
        if node.get("metrics_listen")
        else None,
    ).validate()


def _kafka_settings(node: dict[str, Any]) -> dict[str, Any]:
    return {
        key: parse_address(str(node[key]), setting=key)
        for key in ("kafka_listen", "kafka_advertise")
        if node.get(key)
    }


# TOML keys tls_cert, tls_key, tls_ca, peer_tls, auth_tokens,
# tls_client_ca
_SECURITY_KEYS = ("tls_cert", "tls_key", "tls_ca", "peer_tls", "auth_tokens", "tls_client_ca")


def _security_settings(node: dict[str, Any]) -> dict[str, Any]:
    paths = {k: Path(str(node[k])) for k in _SECURITY_KEYS if k != "peer_tls" and node.get(k)}
    return {**paths, "peer_tls": bool(node.get("peer_tls", False))}
