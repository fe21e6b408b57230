"""Test certificates made with the openssl command line, and a TCP proxy that records bytes.

`make_pki(root)` writes a cluster CA with a node certificate for 127.0.0.1, and a *foreign*
CA with its own node certificate (a process from another cluster, or an impostor).
`make_client_cert(root, name)` adds a client certificate with CN `name` for mutual-TLS client
authentication. `RecordingProxy` forwards one port to another and keeps every byte that
passed, so a test can assert that a known record value never crossed the wire in clear.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
RECORD_BYTES_MAX = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    foreign_ca: Path
    foreign_cert: Path
    foreign_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _authority(root: Path, name: str) -> None:
    _openssl("req", "-x509", *EC_KEY, "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.crt",
             "-days", "2", "-subj", f"/CN={name}-test-ca", cwd=root)  # fmt: skip
    _openssl("req", *EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}-node", cwd=root)  # fmt: skip
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{name}-ca.crt",
             "-CAkey", f"{name}-ca.key", "-CAcreateserial", "-out", f"{name}.crt",
             "-days", "2", "-extfile", "san.ext", cwd=root)  # fmt: skip


def make_pki(root: Path) -> Pki:
    _authority(root, "cluster")
    _authority(root, "foreign")
    return Pki(
        ca=root / "cluster-ca.crt",
        cert=root / "cluster.crt",
        key=root / "cluster.key",
        foreign_ca=root / "foreign-ca.crt",
        foreign_cert=root / "foreign.crt",
        foreign_key=root / "foreign.key",
    )


def make_client_cert(root: Path, name: str, *, authority: str = "cluster", san: str = "") -> Pki:
    """A client certificate with CN `name` (and `san`, e.g. "URI:spiffe://x/alice"), signed by
    `authority` ("cluster" or "foreign", made by `make_pki` in `root`). Returns paths as a
    `Pki` whose `cert`/`key` are the client's and `ca` the authority's."""
    subject = f"/CN={name}" if name else "/O=raftlog-tests"
    _openssl("req", *EC_KEY, "-keyout", f"client-{name}-{authority}.key",
             "-out", f"client-{name}-{authority}.csr", "-subj", subject, cwd=root)  # fmt: skip
    extensions = root / f"client-{name}-{authority}.ext"
    extensions.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", f"client-{name}-{authority}.csr",
             "-CA", f"{authority}-ca.crt", "-CAkey", f"{authority}-ca.key", "-CAcreateserial",
             "-out", f"client-{name}-{authority}.crt", "-days", "2",
             "-extfile", extensions.name, cwd=root)  # fmt: skip
    return Pki(
        ca=root / f"{authority}-ca.crt",
        cert=root / f"client-{name}-{authority}.crt",
        key=root / f"client-{name}-{authority}.key",
        foreign_ca=root / "foreign-ca.crt",
        foreign_cert=root / "foreign.crt",
        foreign_key=root / "foreign.key",
    )


TOKENS = {
    "admin": "admin-token-0123456789abcdef",
    "alice": "alice-token-0123456789abcdef",
    "reader": "reader-token-0123456789abcdef",
    "writer": "writer-token-0123456789abcdef",
    "node": "node-token-0123456789abcdef00",
}


def write_tokens(path: Path) -> Path:
    path.write_text(
        "[tokens]\n"
        + "".join(f'"{token}" = "{name}"\n' for name, token in TOKENS.items())
        + '[permissions.admin]\n"*" = ["read", "write", "admin"]\n'
        + '[permissions.alice]\n"orders" = ["read", "write"]\n"alice-*" = ["read", "write"]\n'
        + '[permissions.reader]\n"orders" = ["read"]\n'
        + '[permissions.writer]\n"orders" = ["write"]\n'
        + '[permissions.node]\n"*" = ["read", "write", "admin", "cluster"]\n'
    )
    return path


class RecordingProxy:
    """Forward 127.0.0.1:<port> to `target`, recording both directions (bounded)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.recorded = bytearray()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    if len(self.recorded) + len(data) <= RECORD_BYTES_MAX:
                        self.recorded += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
            # Each socket is read by one pump, which closes it: left open, it was closed by
            # the garbage collector when this thread ended, as a ResourceWarning that failed
            # whichever test was running then (seen once in CI).
            source.close()

    def wire_bytes(self) -> bytes:
        with self._lock:
            return bytes(self.recorded)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
