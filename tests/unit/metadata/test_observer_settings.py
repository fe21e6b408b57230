"""Settings of an observer (issue 5): a node outside `--peers` needs `--bootstrap`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from raftlog.errors import ConfigError
from raftlog.serve import add_serve_parser, settings_from_args
from raftlog.settings import NodeSettings, parse_bootstrap, settings_from_toml
from raftlog.types import NodeId

PEERS = {NodeId(n): ("127.0.0.1", 9100 + n) for n in (1, 2, 3)}


def _settings(node_id: int, bootstrap: tuple[str, ...] = ()) -> NodeSettings:
    return NodeSettings(
        node_id=NodeId(node_id),
        data_dir=Path("d"),
        listen=("127.0.0.1", 9004),
        raft_listen=("127.0.0.1", 9104),
        peers=PEERS,
        bootstrap=bootstrap,
    )


def test_an_observer_without_bootstrap_is_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--bootstrap.*node 4 is not a voter"):
        _settings(4).validate()
    assert _settings(4, ("127.0.0.1:9001",)).validate().bootstrap == ("127.0.0.1:9001",)
    assert _settings(1).validate().bootstrap == ()  # a voter needs none


@pytest.mark.parametrize("text", ["", " , ", "host", "host:port", "h:70000"])
def test_parse_bootstrap_names_what_was_wrong(text: str) -> None:
    with pytest.raises(ConfigError, match="--bootstrap"):
        parse_bootstrap(text)


def test_parse_bootstrap_keeps_order() -> None:
    assert parse_bootstrap("a:1, b:2,") == ("a:1", "b:2")


def test_bootstrap_from_the_command_line_and_toml(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    peers = "1=127.0.0.1:9101,2=127.0.0.1:9102,3=127.0.0.1:9103"
    node = ["--node-id", "4", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:9004"]
    args = parser.parse_args(
        ["serve", *node, "--peers", peers, "--bootstrap", "127.0.0.1:9001,127.0.0.1:9002"]
    )
    assert settings_from_args(args).bootstrap == ("127.0.0.1:9001", "127.0.0.1:9002")
    toml = tmp_path / "node.toml"
    toml.write_text(
        f'[node]\nnode_id = 4\ndata_dir = "{tmp_path}"\nlisten = "127.0.0.1:9004"\n'
        f'peers = "{peers}"\nbootstrap = "127.0.0.1:9003"\n'
    )
    assert settings_from_toml(toml).bootstrap == ("127.0.0.1:9003",)
    toml.write_text(toml.read_text().replace('bootstrap = "127.0.0.1:9003"\n', ""))
    with pytest.raises(ConfigError, match="bootstrap"):
        settings_from_toml(toml)
