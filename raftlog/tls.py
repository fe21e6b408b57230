"""TLS material for raftlog: gRPC credentials for clients and ssl contexts for peers.

Theory of operation. A node has one certificate and key (`--tls-cert`, `--tls-key`) and one
CA bundle (`--tls-ca`). The same pair serves two listeners:

- the client API (gRPC): server-authenticated TLS; clients verify the node against the CA
  (`tls_ca=` in the client library) and authenticate themselves with a token
  (raftlog.rpc.security), so they need no certificate of their own;
- node-to-node traffic (`--peer-tls`): *mutual* TLS. Each side presents the node certificate
  and requires the other's to chain to the CA, so a process without a certificate signed by
  the cluster's CA never completes the TLS handshake, hence never sends or receives a HELLO
  and never joins a Raft group.

Files are read once at start; an unreadable or malformed file is a `ConfigError` naming the
file and the flag. Key material is never logged or put in an error message.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from raftlog.errors import ConfigError

__all__ = [
    "TlsFiles",
    "grpc_channel_credentials",
    "grpc_server_credentials",
    "peer_ssl_contexts",
    "read_pem",
]

_PEM_MARKER = b"-----BEGIN "


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsFiles:
    """A node's certificate chain, private key and the CA bundle it trusts (PEM files)."""

    cert: Path
    key: Path
    ca: Path | None = None

    def validate(self) -> TlsFiles:
        for flag, path in (("--tls-cert", self.cert), ("--tls-key", self.key)):
            read_pem(path, flag=flag)
        if self.ca is not None:
            read_pem(self.ca, flag="--tls-ca")
        return self


def read_pem(path: Path, *, flag: str) -> bytes:
    """The bytes of a PEM file, or a ConfigError naming the flag and file (never the content)."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"{flag} {path}: cannot read: {error.strerror}") from None
    if _PEM_MARKER not in data:
        raise ConfigError(f"{flag} {path}: not a PEM file (no '-----BEGIN' line)")
    assert data
    return data


def grpc_server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server-authenticated TLS for the client API (clients authenticate with tokens)."""
    chain = read_pem(files.cert, flag="--tls-cert")
    key = read_pem(files.key, flag="--tls-key")
    credentials = grpc.ssl_server_credentials([(key, chain)], require_client_auth=False)
    assert credentials is not None
    return credentials


def grpc_channel_credentials(ca: Path | str | None) -> grpc.ChannelCredentials:
    """Credentials for a client channel that trusts `ca` (None: the system's roots)."""
    roots = None if ca is None else read_pem(Path(ca), flag="tls_ca")
    credentials = grpc.ssl_channel_credentials(root_certificates=roots)
    assert credentials is not None
    return credentials


def peer_ssl_contexts(files: TlsFiles) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts for mutual TLS between nodes; both require the CA.

    The server side demands a client certificate (CERT_REQUIRED): without it a dialer's
    handshake fails before the transport reads a single frame.
    """
    if files.ca is None:
        raise ConfigError("--peer-tls: needs --tls-ca (the CA that signs every node's cert)")
    cafile = str(files.ca)
    read_pem(files.ca, flag="--tls-ca")
    server = _context(ssl.Purpose.CLIENT_AUTH, cafile, files)
    server.verify_mode = ssl.CERT_REQUIRED
    client = _context(ssl.Purpose.SERVER_AUTH, cafile, files)
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    return server, client


def _context(purpose: ssl.Purpose, cafile: str, files: TlsFiles) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(purpose, cafile=cafile)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(files.cert), str(files.key))
    except (ssl.SSLError, OSError) as error:
        raise ConfigError(
            f"--tls-cert {files.cert} / --tls-key {files.key} / --tls-ca {cafile}: "
            f"not a usable certificate, key and CA: {error}"
        ) from None
    return context
