"""`raftlog cluster up` with TLS and auth: its nodes get the options, nothing secret is
printed or logged, a restarted node keeps them, and bad combinations are refused before
any node starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.client import Admin
from raftlog.client.errors import ClientError
from raftlog.local_cluster import LocalCluster
from tests.security.pki import TOKENS, Pki, write_tokens


def raftlog(*argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftlog", *argv], capture_output=True, text=True, timeout=timeout_s
    )


@pytest.fixture(scope="module")
def secure_up(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[tuple[Path, str]]:
    directory = tmp_path_factory.mktemp("up")
    tokens = write_tokens(directory / "tokens.toml")
    tokens.chmod(0o600)
    done = raftlog(
        "cluster", "up", "--nodes", "1", "--dir", str(directory / "cluster"),
        "--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tls-ca", str(pki.ca),
        "--peer-tls", "--auth-tokens", str(tokens), "--timeout", "60",
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr
        yield directory / "cluster", done.stdout + done.stderr
    finally:
        raftlog("cluster", "down", "--dir", str(directory / "cluster"))


def test_the_nodes_serve_tls_and_require_tokens(secure_up: tuple[Path, str], pki: Pki) -> None:
    directory, _ = secure_up
    bootstrap = LocalCluster.load(directory).bootstrap
    with Admin(bootstrap, tls_ca=pki.ca, token=TOKENS["admin"], request_timeout_ms=5000) as a:
        a.create_topic("up-topic", partitions=1, replication_factor=1)
        assert "up-topic" in a.list_topics()
    with (
        Admin(bootstrap, tls_ca=pki.ca, request_timeout_ms=3000) as anonymous,
        pytest.raises(ClientError, match="UNAUTHENTICATED"),
    ):
        anonymous.list_topics()
    with (
        Admin(bootstrap, token=TOKENS["admin"], request_timeout_ms=2000) as plaintext,
        pytest.raises(ClientError),
    ):
        plaintext.list_topics()


def test_nothing_secret_is_printed_logged_or_saved(secure_up: tuple[Path, str]) -> None:
    directory, output = secure_up
    saved = (directory / "cluster.json").read_text()
    logs = "".join(path.read_text(errors="replace") for path in directory.glob("node-*.log"))
    for text in (output, saved, logs):
        assert not any(token in text for token in TOKENS.values())
        assert "PRIVATE KEY" not in text
    flags = json.loads(saved)["node_flags"]
    assert "--peer-tls" in flags and "--auth-tokens" in flags
    assert all(Path(flag).is_absolute() for flag in flags if not flag.startswith("--"))


def test_a_restarted_node_keeps_its_security_flags(secure_up: tuple[Path, str], pki: Pki) -> None:
    directory, _ = secure_up
    cluster = LocalCluster.load(directory)
    command = cluster.command(cluster.nodes[1])
    assert command[command.index("--tls-cert") + 1] == str(pki.cert.resolve())
    assert "--peer-tls" in command


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--peer-tls",), "peer_tls"),
        (("--tls-client-ca", "ca.pem"), "tls_client_ca"),
        (("--tls-cert", "cert.pem"), "tls_cert and tls_key"),
        (("--tls-cert", "absent.pem", "--tls-key", "absent.key"), "cannot read"),
    ],
)
def test_bad_security_options_are_refused_before_any_node_starts(
    tmp_path: Path, flags: tuple[str, ...], expected: str
) -> None:
    done = raftlog("cluster", "up", "--nodes", "1", "--dir", str(tmp_path / "c"), *flags)
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_status_of_a_secure_cluster_needs_only_its_directory(secure_up: tuple[Path, str]) -> None:
    directory, _ = secure_up
    done = raftlog("cluster", "status", "--dir", str(directory))
    assert done.returncode == 0 and "controller node 1" in done.stdout, done.stderr
    assert not any(token in done.stdout + done.stderr for token in TOKENS.values())
