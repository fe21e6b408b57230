"""kcat (librdkafka) against raftlog's Kafka listener: metadata, produce, consume."""

from __future__ import annotations

import subprocess

from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic, kcat_path

# Keys, values with spaces and non-ASCII bytes, an empty value, and headers on each record.
RECORDS = [
    (b"k1", b"hello"),
    (b"k2", b"world with spaces"),
    (b"k3", "caf\u00e9".encode()),
    (b"k4", b""),
]


def kcat(
    *args: str, stdin: bytes = b"", timeout_s: float = 60
) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(
        [kcat_path(), *args], input=stdin, capture_output=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done


def test_metadata_lists_topics_and_raft_leaders(kafka_cluster: LocalCluster) -> None:
    create_topic(kafka_cluster, "kcat-meta", partitions=3)
    listing = kcat("-b", kafka_cluster.kafka_bootstrap, "-L", "-t", "kcat-meta").stdout.decode()
    assert "3 brokers:" in listing, listing
    for node in kafka_cluster.nodes.values():
        assert f"broker {node.node_id} at 127.0.0.1:{node.kafka_port}" in listing, listing
    assert 'topic "kcat-meta" with 3 partitions:' in listing, listing
    for partition in range(3):
        assert f"partition {partition}, leader " in listing, listing


def test_idempotent_produce_acks_all_then_consume_byte_for_byte(
    kafka_cluster: LocalCluster,
) -> None:
    create_topic(kafka_cluster, "kcat-data", partitions=1)
    boot = kafka_cluster.kafka_bootstrap
    lines = b"".join(key + b"\t" + value + b"\n" for key, value in RECORDS)
    kcat(
        "-b",
        boot,
        "-P",
        "-t",
        "kcat-data",
        "-K",
        "\t",
        "-H",
        "h1=v1",
        "-H",
        "h2=",
        "-X",
        "acks=all",
        "-X",
        "enable.idempotence=true",
        stdin=lines,
    )
    # %k/%s/%h between unit separators: nothing in the records can be mistaken for them.
    out = kcat(
        "-b",
        boot,
        "-C",
        "-t",
        "kcat-data",
        "-o",
        "beginning",
        "-e",
        "-f",
        "%o\x1f%k\x1f%s\x1f%h\x1e",
    ).stdout
    consumed = [tuple(r.split(b"\x1f")) for r in out.split(b"\x1e") if r]
    assert [(k, v) for _, k, v, _ in consumed] == RECORDS
    assert all(h == b"h1=v1,h2=" for *_, h in consumed), consumed
    offsets = [int(o) for o, *_ in consumed]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(RECORDS)
