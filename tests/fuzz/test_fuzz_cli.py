"""Fuzzing the command line's inputs: flags, addresses, overrides, topic configs.

Whatever the argv, parsing ends in a clean refusal (argparse's exit 2, or a ConfigError /
ClientError / UsageError naming the bad input) and never in another exception. Only the
offline paths are fuzzed: nothing here opens a socket or starts a node.
"""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from raftlog.cli import build_parser, main
from raftlog.client._connection import parse_bootstrap
from raftlog.client.errors import ClientError
from raftlog.client_cli import UsageError, _parse_configs, resolve_bootstrap
from raftlog.config import NodeConfig
from raftlog.errors import ConfigError
from raftlog.serve import settings_from_args
from raftlog.settings import apply_overrides, parse_address, parse_peers
from tests.fuzz.budget import fuzz_settings

SERVE_FLAGS = ["--node-id", "--data-dir", "--listen", "--advertise", "--raft-listen",
               "--raft-advertise", "--peers", "--cluster-id", "--set", "--tls-cert",
               "--tls-key", "--tls-ca", "--auth-tokens", "--peer-tls", "--config",
               "--metrics-listen"]  # fmt: skip
text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=30)
values = st.one_of(
    text,
    st.integers(-5, 70000).map(str),
    st.sampled_from(["127.0.0.1:9092", "1=127.0.0.1:9192", "raft.election_timeout_ticks=3"]),
)


PARSER = build_parser()  # built once: argparse parsers are reusable


@fuzz_settings(200)
@given(st.lists(st.one_of(st.sampled_from(SERVE_FLAGS), values), max_size=12))
def test_serve_arguments_parse_or_are_refused_cleanly(argv: list[str]) -> None:
    parser = PARSER
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            args = parser.parse_args(["serve", *argv])
        except SystemExit as exit_:
            assert exit_.code == 2
            return
    with contextlib.suppress(ConfigError):
        settings_from_args(args)  # builds settings only; never starts a node


@fuzz_settings(300)
@given(text)
def test_addresses_and_peers_parse_or_name_the_input(value: str) -> None:
    for parse in (
        lambda: parse_address(value, setting="--listen"),
        lambda: parse_peers(value),
    ):
        with contextlib.suppress(ConfigError):
            parse()
    with contextlib.suppress(ClientError):
        parse_bootstrap(value)


@fuzz_settings(200)
@given(st.lists(st.one_of(text, st.sampled_from(["tick_interval_ms=7", "raft.pre_vote=true"]))))
@example([".="])  # an empty section name
@example(["nope.x=1", "validate.x=1"])
def test_overrides_and_topic_configs_are_refused_cleanly(items: list[str]) -> None:
    with contextlib.suppress(ConfigError):
        apply_overrides(NodeConfig(), items)
    with contextlib.suppress(UsageError):
        _parse_configs(items)


def test_bootstrap_resolution_refuses_without_any_source(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAFTLOG_BOOTSTRAP", raising=False)
    monkeypatch.chdir(str(tmp_path))
    with pytest.raises(UsageError, match="no bootstrap address"):
        resolve_bootstrap(None)


def test_an_unreadable_tls_ca_fails_the_command_before_any_connection(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["topic", "list", "--bootstrap", "127.0.0.1:1", "--tls-ca", "/nonexistent.pem"])
    assert code == 1
    assert "/nonexistent.pem" in capsys.readouterr().err
