"""The Kafka listener's settings: --kafka-listen/--kafka-advertise and the TOML keys."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from raftlog.errors import ConfigError
from raftlog.serve import add_serve_parser, settings_from_args
from raftlog.settings import settings_from_toml


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


BASE = ("--node-id", "1", "--data-dir", "d", "--listen", "127.0.0.1:9091",
        "--peers", "1=127.0.0.1:9191")  # fmt: skip


def test_flags_set_the_listener_and_the_advertised_address() -> None:
    assert settings_from_args(_args(*BASE)).kafka_address == ""  # off by default
    listening = settings_from_args(_args(*BASE, "--kafka-listen", "0.0.0.0:9092"))
    assert listening.kafka_listen == ("0.0.0.0", 9092)
    assert listening.kafka_address == "0.0.0.0:9092"
    advertised = settings_from_args(
        _args(*BASE, "--kafka-listen", "0.0.0.0:9092", "--kafka-advertise", "kafka1:19092")
    )
    assert advertised.kafka_address == "kafka1:19092"


def test_bad_kafka_settings_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--kafka-listen"):
        settings_from_args(_args(*BASE, "--kafka-listen", "no-port"))
    with pytest.raises(ConfigError, match=r"kafka_advertise .*needs kafka_listen"):
        settings_from_args(_args(*BASE, "--kafka-advertise", "h:1"))
    toml = tmp_path / "node.toml"
    toml.write_text(
        '[node]\nnode_id = 1\ndata_dir = "d"\nlisten = "127.0.0.1:9091"\n'
        'peers = "1=127.0.0.1:9191"\nkafka_listen = "127.0.0.1:9092"\n'
        'kafka_advertise = "k:9"\n'
    )
    assert settings_from_toml(toml).kafka_address == "k:9"
    toml.write_text(toml.read_text().replace('"127.0.0.1:9092"', '"nope"'))
    with pytest.raises(ConfigError, match="kafka_listen"):
        settings_from_toml(toml)


def test_topic_auto_creation_is_off_by_default_and_set_with_kafka_s_names() -> None:
    assert not settings_from_args(_args(*BASE)).config.kafka.auto_create_topics_enable
    sets = ("--set", "kafka.auto_create_topics_enable=true", "--set", "kafka.num_partitions=6",
            "--set", "kafka.default_replication_factor=2")  # fmt: skip
    kafka = settings_from_args(_args(*BASE, *sets)).config.kafka
    assert (kafka.auto_create_topics_enable, kafka.num_partitions) == (True, 6)
    assert kafka.default_replication_factor == 2
    with pytest.raises(ConfigError, match=r"kafka.default_replication_factor: must not exceed"):
        settings_from_args(_args(*BASE, "--set", "kafka.default_replication_factor=8"))
    with pytest.raises(ConfigError, match=r"kafka.num_partitions: must not exceed"):
        settings_from_args(_args(*BASE, "--set", "kafka.num_partitions=1001"))
    with pytest.raises(ConfigError, match=r"num_partitions: must be positive"):
        settings_from_args(_args(*BASE, "--set", "kafka.num_partitions=0"))
