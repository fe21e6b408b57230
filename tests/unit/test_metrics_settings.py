"""Where a node serves metrics: `--metrics-listen HOST:PORT` or `metrics_listen` in the
`[node]` table, checked like every other address (a bad one is refused, naming it)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from raftlog.errors import ConfigError
from raftlog.serve import add_serve_parser, settings_from_args
from raftlog.settings import settings_from_toml


def _toml(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(
        f'[node]\nnode_id = 1\ndata_dir = "{tmp_path / "d"}"\nlisten = "127.0.0.1:9091"\n'
        f'peers = "1=127.0.0.1:9191"\n{extra}'
    )
    return path


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_the_toml_key_sets_the_metrics_address(tmp_path: Path) -> None:
    settings = settings_from_toml(_toml(tmp_path, 'metrics_listen = "0.0.0.0:9100"\n'))
    assert settings.metrics_listen == ("0.0.0.0", 9100)
    assert settings_from_toml(_toml(tmp_path, "")).metrics_listen is None


def test_a_bad_metrics_address_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="metrics_listen: expected HOST:PORT"):
        settings_from_toml(_toml(tmp_path, 'metrics_listen = "9100"\n'))
    flags = ("--node-id", "1", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:9091")
    with pytest.raises(ConfigError, match="--metrics-listen: expected HOST:PORT"):
        settings_from_args(_args(*flags, "--peers", "1=127.0.0.1:9191", "--metrics-listen", "x"))


def test_the_flag_wins_over_the_toml_key(tmp_path: Path) -> None:
    config = _toml(tmp_path, 'metrics_listen = "0.0.0.0:9100"\n')
    args = _args("--config", str(config), "--metrics-listen", "127.0.0.1:9200")
    assert settings_from_args(args).metrics_listen == ("127.0.0.1", 9200)
