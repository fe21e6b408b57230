"""Token files, grants and the flags that turn security on (no sockets)."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.errors import ConfigError
from raftlog.rpc.security import ClientLimits, Permission, load_access_control
from raftlog.serve import add_serve_parser, settings_from_args
from tests.security.pki import TOKENS, Pki


def test_tokens_map_to_principals_and_grants_follow_patterns(tokens_file: Path) -> None:
    access = load_access_control(tokens_file)
    alice = access.authenticate(TOKENS["alice"])
    assert alice == "alice" and access.authenticate("x" * 40) is None
    assert access.allowed(alice, Permission.WRITE, "orders")
    assert access.allowed(alice, Permission.READ, "alice-private")  # prefix pattern
    assert not access.allowed(alice, Permission.READ, "ordersX")  # exact names are exact
    assert not access.allowed(alice, Permission.ADMIN, "orders")
    assert not access.allowed("reader", Permission.WRITE, "orders")
    assert access.node_token == TOKENS["node"]  # the principal with `cluster`
    assert TOKENS["alice"] not in repr(access)  # only digests are kept


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[tokens]\n"short" = "alice"\n', "at least 16 characters"),
        ('[permissions.alice]\n"t" = ["read", "fly"]\n', "expected a list"),
        ("[users]\n", "unknown tables"),
        ("[tokens\n", "tokens.toml"),
    ],
)
def test_bad_token_files_are_refused_naming_the_entry(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected) as caught:
        load_access_control(path)
    assert "short" not in str(caught.value) or "short" in expected  # no token echoed


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 300), st.booleans())))
def test_client_limits_never_exceed_their_bounds(steps: list[tuple[str, int, bool]]) -> None:
    limits = ClientLimits(requests_in_flight_max=3, produce_buffer_bytes_max=500)
    held: list[tuple[str, int]] = []
    for client, size, release in steps:
        if release and held:
            limits.release(*held.pop(0))
        elif limits.refusal(client, size) is None:
            limits.acquire(client, size)
            held.append((client, size))
        assert limits.produce_bytes == sum(size for _, size in held) <= 500
        assert all(count <= 3 for count in limits.in_flight.values())
    for item in held:
        limits.release(*item)
    assert limits.in_flight == {} and limits.produce_bytes == 0


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    base = ("serve", "--node-id", "1", "--data-dir", "/tmp/x", "--listen", "127.0.0.1:1",
            "--peers", "1=127.0.0.1:101")  # fmt: skip
    return parser.parse_args([*base, *argv])


def test_serve_flags_reach_the_settings(pki: Pki, tokens_file: Path) -> None:
    settings_ = settings_from_args(
        parse(
            "--tls-cert",
            str(pki.cert),
            "--tls-key",
            str(pki.key),
            "--tls-ca",
            str(pki.ca),
            "--peer-tls",
            "--auth-tokens",
            str(tokens_file),
        )
    )
    assert settings_.tls_cert == pki.cert and settings_.peer_tls
    assert settings_.auth_tokens == tokens_file


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(("--tls-cert", "c.pem"), "go together"), (("--peer-tls",), "needs tls_cert")],
)
def test_incomplete_tls_flags_are_refused(argv: tuple[str, ...], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        settings_from_args(parse(*argv))


def test_toml_security_keys(tmp_path: Path, pki: Pki, tokens_file: Path) -> None:
    from raftlog.settings import settings_from_toml

    path = tmp_path / "node.toml"
    path.write_text(
        f'[node]\nnode_id = 1\ndata_dir = "{tmp_path}"\nlisten = "127.0.0.1:1"\n'
        f'peers = "1=127.0.0.1:101"\ntls_cert = "{pki.cert}"\ntls_key = "{pki.key}"\n'
        f'tls_ca = "{pki.ca}"\npeer_tls = true\nauth_tokens = "{tokens_file}"\n'
    )
    loaded = settings_from_toml(path)
    assert loaded.tls_ca == pki.ca and loaded.peer_tls and loaded.auth_tokens == tokens_file


def test_unreadable_pem_names_the_flag_not_the_content(tmp_path: Path) -> None:
    from raftlog.tls import TlsFiles

    key = tmp_path / "key.pem"
    key.write_text("PRIVATE KEY MATERIAL without a header")
    with pytest.raises(ConfigError, match="--tls-cert") as caught:
        TlsFiles(cert=tmp_path / "missing.pem", key=key).validate()
    assert "MATERIAL" not in str(caught.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("client_requests_in_flight_max=0", "client_requests_in_flight_max: must be positive"),
        ("client_connection_idle_ms_max=0", "client_connection_idle_ms_max: must be positive"),
        ("produce_buffer_bytes_max=1000", "produce_buffer_bytes_max: must hold at least one"),
    ],
)
def test_limits_are_validated_with_the_rest_of_the_config(override: str, expected: str) -> None:
    from raftlog.config import NodeConfig
    from raftlog.settings import apply_overrides

    with pytest.raises(ConfigError, match=expected):
        apply_overrides(NodeConfig(), [override])
    tuned = apply_overrides(NodeConfig(), ["client_requests_in_flight_max=4"])
    assert tuned.client_requests_in_flight_max == 4


shapes = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(shapes)
def test_any_permissions_shape_is_loaded_or_refused_cleanly(entries: object) -> None:
    from raftlog.rpc.security import _grants

    try:
        grants = _grants(entries, Path("tokens.toml"), "p")
    except ConfigError as error:
        assert "[permissions.p]" in str(error)
        return
    assert all(grant.permissions <= frozenset(Permission) for grant in grants)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=120))
def test_any_token_file_text_loads_or_is_refused_cleanly(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = tmp_path_factory.mktemp("text") / "tokens.toml"
    path.write_text(text)
    path.chmod(0o600)
    with contextlib.suppress(ConfigError):
        load_access_control(path)
