"""TLS material for raftlog: gRPC credentials for clients and ssl contexts for peers.

Theory of operation. A node has one certificate and key (`--tls-cert`, `--tls-key`) and one
CA bundle (`--tls-ca`). The same pair serves two listeners:

- the client API (gRPC): server-authenticated TLS; clients verify the node against the CA
  (`tls_ca=` in the client library) and authenticate themselves with a token
  (raftlog.rpc.security), so they need no certificate of their own. With `--tls-client-ca`
  the client API is *mutual* TLS: every client must present a certificate (`tls_cert=`,
  `tls_key=`) signed by that CA, and its CN (or, without a CN, its first SAN) is its
  principal. gRPC cannot ask for a certificate without requiring it, so a client without
  one, or with one from another CA, has its connection closed right after the handshake;
  `diagnose_tls_refusal` tells such a client why, since the server cannot answer it;
- node-to-node traffic (`--peer-tls`): *mutual* TLS. Each side presents the node certificate
  and requires the other's to chain to the CA, so a process without a certificate signed by
  the cluster's CA never completes the TLS handshake, hence never sends or receives a HELLO
  and never joins a Raft group.

Files are read once at start; an unreadable or malformed file is a `ConfigError` naming the
file and the flag. Key material is never logged or put in an error message.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from raftlog.errors import ConfigError

__all__ = [
    "TlsFiles",
    "diagnose_tls_refusal",
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


def grpc_server_credentials(
    files: TlsFiles, *, client_ca: Path | None = None
) -> grpc.ServerCredentials:
    """TLS for the client API: server-authenticated, or mutual when `client_ca` is given
    (every client must then present a certificate that chains to it)."""
    chain = read_pem(files.cert, flag="--tls-cert")
    key = read_pem(files.key, flag="--tls-key")
    roots = None if client_ca is None else read_pem(client_ca, flag="--tls-client-ca")
    credentials = grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=roots, require_client_auth=roots is not None
    )
    assert credentials is not None
    return credentials


def grpc_channel_credentials(
    ca: Path | str | None,
    *,
    cert: Path | str | None = None,
    key: Path | str | None = None,
) -> grpc.ChannelCredentials:
    """Credentials for a client channel that trusts `ca` (None: the system's roots) and,
    with `cert` and `key`, presents that client certificate (mutual TLS)."""
    if (cert is None) != (key is None):
        raise ConfigError("tls_cert and tls_key (a client certificate and its key) go together")
    roots = None if ca is None else read_pem(Path(ca), flag="tls_ca")
    chain = None if cert is None else read_pem(Path(cert), flag="tls_cert")
    private_key = None if key is None else read_pem(Path(key), flag="tls_key")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=roots, private_key=private_key, certificate_chain=chain
    )
    assert credentials is not None
    return credentials


def diagnose_tls_refusal(
    address: str,
    *,
    ca: Path | str | None,
    cert: Path | str | None = None,
    key: Path | str | None = None,
    timeout_s: float = 3.0,
) -> str | None:
    """Why a TLS node at `address` refused this client, or None if it did not (or is down).

    Called only after a call failed as UNAVAILABLE. gRPC reports a refused client
    certificate as a closed socket; this replays the handshake with the same files: a node
    that closes the connection right after the handshake, before its first HTTP/2 frame,
    refused the client's certificate (or its lack of one).
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")  # an IPv6 literal as gRPC writes it: [::1]:9092
    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=None if ca is None else str(ca)
        )
        context.set_alpn_protocols(["h2"])
        if cert is not None and key is not None:
            context.load_cert_chain(str(cert), str(key))
        with (
            socket.create_connection((host, int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            first = tls.recv(1)
    except ssl.SSLCertVerificationError as error:
        return f"the node's certificate is not trusted by tls_ca: {error.verify_message}"
    except ssl.SSLError as error:
        return f"the TLS handshake failed ({error.reason}): is the node serving TLS?"
    except (OSError, ValueError):
        return None  # down, slow or unreachable: not a TLS refusal
    if first:
        return None
    presented = "presented none" if cert is None else f"presented {cert}"
    return (
        "the node closed the TLS connection after the handshake: it requires a client "
        f"certificate signed by its client CA (--tls-client-ca) and this client {presented}"
    )


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
