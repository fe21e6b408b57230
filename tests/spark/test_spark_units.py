"""The connector's pure parts, without Spark or a cluster: options, offset arithmetic, Arrow.

The Arrow decoder is checked against `raftlog.storage.records.decode_batch` (the reference
decoder) on random batches, compressed or not, with null keys and values, headers, control
batches and arbitrary offset windows; and it must refuse corrupt bytes and anything at or above
the high watermark.
"""

from __future__ import annotations

import itertools
import json
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.client._connection import TopicPartition
from raftlog.client.errors import ClientError
from raftlog.connectors.spark.arrow import decode_fetch
from raftlog.connectors.spark.options import parse_sink_options, parse_source_options
from raftlog.connectors.spark.planning import (
    OffsetRange,
    from_json_offsets,
    limit_offsets,
    plan_ranges,
    split_ranges,
    to_json_offsets,
)
from raftlog.errors import ConfigError, CorruptBatchError
from raftlog.storage.batch import Compression, patch_base_offset_and_epoch
from raftlog.storage.control_batches import encode_txn_marker
from raftlog.storage.records import (
    CONTROL_LEADER_CHANGE,
    RecordInput,
    decode_batch,
    encode_batch,
    encode_control_batch,
)

pytestmark = pytest.mark.spark

BOOT = "127.0.0.1:9091"


# -- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "streaming", "named"),
    [
        ({"subscribe": "t"}, True, "bootstrap"),
        ({"bootstrap": BOOT}, True, "subscribe"),
        ({"bootstrap": BOOT, "subscribe": "t", "assign": '{"t": [0]}'}, True, "assign"),
        ({"bootstrap": BOOT, "subscribe": "t", "kafka.group.id": "g"}, True, "kafka.group.id"),
        (
            {"bootstrap": BOOT, "subscribe": "t", "maxOffsetsPerTrigger": "0"},
            True,
            "maxOffsetsPerTrigger",
        ),
        (
            {"bootstrap": BOOT, "subscribe": "t", "maxOffsetsPerTrigger": "x"},
            True,
            "maxOffsetsPerTrigger",
        ),
        (
            {"bootstrap": BOOT, "subscribe": "t", "maxOffsetsPerTrigger": "5"},
            False,
            "maxOffsetsPerTrigger",
        ),
        ({"bootstrap": BOOT, "subscribe": "t", "endingOffsets": "latest"}, True, "endingOffsets"),
        (
            {"bootstrap": BOOT, "subscribe": "t", "startingOffsets": "latest"},
            False,
            "startingOffsets",
        ),
        ({"bootstrap": BOOT, "subscribe": "t", "startingOffsets": "{bad"}, True, "startingOffsets"),
        (
            {"bootstrap": BOOT, "subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'},
            True,
            "startingOffsets",
        ),
        (
            {"bootstrap": BOOT, "subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'},
            False,
            "endingOffsets",
        ),
        (
            {
                "bootstrap": BOOT,
                "subscribe": "t",
                "startingTimestamp": "5",
                "startingOffsets": "earliest",
            },
            True,
            "startingTimestamp",
        ),
        (
            {
                "bootstrap": BOOT,
                "subscribe": "t",
                "minOffsetsPerTrigger": "9",
                "maxOffsetsPerTrigger": "3",
            },
            True,
            "minOffsetsPerTrigger",
        ),
        ({"bootstrap": BOOT, "subscribe": "t", "maxTriggerDelay": "5m"}, True, "maxTriggerDelay"),
        (
            {
                "bootstrap": BOOT,
                "subscribe": "t",
                "minOffsetsPerTrigger": "1",
                "maxTriggerDelay": "5 parsecs",
            },
            True,
            "maxTriggerDelay",
        ),
        ({"bootstrap": BOOT, "subscribe": "t", "failOnDataLoss": "maybe"}, True, "failOnDataLoss"),
        ({"bootstrap": BOOT, "subscribe": "bad topic!"}, True, "subscribe"),
        ({"bootstrap": BOOT, "subscribePattern": "("}, True, "subscribePattern"),
        ({"bootstrap": BOOT, "assign": '{"t": ["x"]}'}, True, "assign"),
        ({"bootstrap": "nohost", "subscribe": "t"}, True, "bootstrap"),
        (
            {"bootstrap": BOOT, "subscribe": "t", "fetchBytesMax": str(1 << 30)},
            True,
            "fetchBytesMax",
        ),
    ],
)
def test_a_bad_source_option_is_named(options: dict[str, str], streaming: bool, named: str) -> None:
    lowered = {k.lower(): v for k, v in options.items()}  # Spark lower-cases option names
    with pytest.raises(ConfigError, match=f"^{named}:"):
        parse_source_options(lowered, streaming=streaming)


def test_source_options_parse_kafka_forms() -> None:
    options = parse_source_options(
        {
            "bootstrap": f"{BOOT}, 127.0.0.1:9092",
            "assign": '{"b": [1, 0], "a": [2]}',
            "startingoffsets": '{"a": {"2": 7}, "b": {"0": -2, "1": -1}}',
            "minoffsetspertrigger": "10",
            "maxtriggerdelay": "30s",
            "includeheaders": "TRUE",
        },
        streaming=True,
    )
    assert options.bootstrap == f"{BOOT},127.0.0.1:9092"
    assert options.subscription.partitions == (("a", 2), ("b", 0), ("b", 1))
    assert options.starting_offsets == {"a": {2: 7}, "b": {0: -2, 1: -1}}
    assert (options.min_offsets_per_trigger, options.max_trigger_delay_ms) == (10, 30_000)
    assert options.include_headers and options.fail_on_data_loss
    # Plain data only: the options travel pickled to every worker.
    assert pickle.loads(pickle.dumps(options)) == options


def test_sink_options() -> None:
    assert parse_sink_options({"bootstrap": BOOT, "topic": "t"}).topic == "t"
    assert parse_sink_options({"bootstrap": BOOT, "lingerms": "0"}).linger_ms == 0
    with pytest.raises(ConfigError, match=r"^compression:"):
        parse_sink_options({"bootstrap": BOOT, "compression": "brotli"})
    with pytest.raises(ConfigError, match=r"^subscribe:"):
        parse_sink_options({"bootstrap": BOOT, "subscribe": "t"})


# -- offsets ------------------------------------------------------------------------------------

topic_partitions = st.builds(
    TopicPartition, st.sampled_from(["a", "b", "events"]), st.integers(0, 12)
)
positions = st.dictionaries(topic_partitions, st.integers(0, 10**6), max_size=8)


@given(positions)
@settings(max_examples=60)
def test_checkpoint_json_is_canonical(position: dict[TopicPartition, int]) -> None:
    """Spark compares offsets as JSON strings: equal positions give equal strings."""
    encoded = to_json_offsets(position)
    assert json.dumps(encoded) == json.dumps(encoded, sort_keys=True)
    shuffled = dict(reversed(list(position.items())))
    assert json.dumps(to_json_offsets(shuffled)) == json.dumps(encoded)
    assert from_json_offsets(json.loads(json.dumps(encoded))) == position


def test_a_malformed_checkpoint_is_named() -> None:
    with pytest.raises(ConfigError, match="start offset: bad entry t/x"):
        from_json_offsets({"t": {"x": 1}}, what="start offset")


@st.composite
def backlogs(draw: st.DrawFn) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    start = draw(positions)
    latest = {tp: offset + draw(st.integers(0, 5000)) for tp, offset in start.items()}
    return start, latest


@given(backlogs(), st.integers(1, 20_000))
@settings(max_examples=80)
def test_rate_limit_moves_exactly_min_of_limit_and_backlog(
    window: tuple[dict[TopicPartition, int], dict[TopicPartition, int]], limit: int
) -> None:
    start, latest = window
    end = limit_offsets(start, latest, limit)
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in start)
    backlog = sum(latest[tp] - start[tp] for tp in start)
    assert sum(end[tp] - start[tp] for tp in start) == min(limit, backlog)


@given(backlogs(), st.one_of(st.none(), st.integers(1, 64)))
@settings(max_examples=80)
def test_split_ranges_tile_the_offsets(
    window: tuple[dict[TopicPartition, int], dict[TopicPartition, int]], min_partitions: int | None
) -> None:
    start, end = window
    ranges = plan_ranges(start, end)
    pieces = split_ranges(ranges, min_partitions)
    covered = sorted((r.topic, r.partition, r.offset_from, r.offset_to) for r in pieces)
    for tp in start:
        mine = [(lo, hi) for t, p, lo, hi in covered if (t, p) == tp]
        assert all(lo < hi for lo, hi in mine)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(mine))
        if mine:
            assert (mine[0][0], mine[-1][1]) == (start[tp], end[tp])
    total = sum(r.size for r in ranges)
    if min_partitions is not None:
        assert len(pieces) >= min(min_partitions, total)


def test_split_ranges_example() -> None:
    ranges = [OffsetRange("t", 0, 0, 90), OffsetRange("t", 1, 0, 10)]
    pieces = split_ranges(ranges, 4)
    assert [(r.partition, r.offset_from, r.offset_to) for r in pieces] == [
        (0, 0, 22),
        (0, 22, 45),
        (0, 45, 67),
        (0, 67, 90),
        (1, 0, 10),
    ]


# -- Arrow --------------------------------------------------------------------------------------

optional_bytes = st.one_of(st.none(), st.binary(max_size=40))
headers = st.lists(st.tuples(st.text(max_size=5), optional_bytes), max_size=2).map(tuple)
record_inputs = st.builds(
    RecordInput, optional_bytes, optional_bytes, st.integers(0, 10**13), headers
)
equal_records = st.builds(
    lambda n, v, ts: [RecordInput(None, v, ts) for _ in range(n)],
    st.integers(1, 30),
    st.binary(min_size=0, max_size=200),
    st.integers(0, 10**13),
)


@st.composite
def fetch_answers(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """Several batches back to back (as a Fetch returns them), control batches among them."""
    batches: list[bytes] = []
    offset = draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.booleans()) and draw(st.booleans()):
            batch = encode_control_batch(
                CONTROL_LEADER_CHANGE, b"x", timestamp_ms=1, base_offset=offset
            )
        else:
            records = draw(
                st.one_of(st.lists(record_inputs, min_size=1, max_size=30), equal_records)
            )
            codec = draw(st.sampled_from([Compression.NONE, Compression.LZ4, Compression.ZSTD]))
            batch = encode_batch(
                records,
                base_offset=offset,
                compression=codec,
                timestamp_type=draw(st.sampled_from([0, 0, 1])),
            )
        batches.append(batch)
        offset += decode_batch(batch).header.offset_count
    return b"".join(batches), batches


def _reference(batches: list[bytes], low: int, high: int) -> list[dict[str, object]]:
    rows = []
    for raw in batches:
        decoded = decode_batch(raw)
        if decoded.header.is_control:
            continue
        for record in decoded.records:
            if low <= record.offset < high:
                rows.append(
                    {
                        "key": record.key,
                        "value": record.value,
                        "offset": record.offset,
                        "timestamp_ms": record.timestamp_ms,
                        "timestampType": decoded.header.timestamp_type,
                        "headers": [{"key": k, "value": v} for k, v in record.headers] or None,
                    }
                )
    return rows


@given(fetch_answers(), st.integers(0, 1200), st.integers(0, 400), st.booleans())
@settings(max_examples=120, deadline=None)
def test_decode_fetch_equals_the_reference_decoder(
    answer: tuple[bytes, list[bytes]], low: int, width: int, include_headers: bool
) -> None:
    data, batches = answer
    last = decode_batch(batches[-1]).header.last_offset
    result = decode_fetch(
        data,
        topic="events",
        partition=3,
        offset_from=low,
        offset_to=low + width,
        high_watermark=last + 1,
        include_headers=include_headers,
    )
    expected = _reference(batches, low, low + width)
    rows = [] if result.batch is None else result.batch.to_pylist()
    assert len(rows) == len(expected)
    for row, want in zip(rows, expected, strict=True):
        assert (row["key"], row["value"], row["offset"]) == (
            want["key"],
            want["value"],
            want["offset"],
        )
        assert (row["topic"], row["partition"]) == ("events", 3)
        assert row["timestampType"] == want["timestampType"]
        micros = row["timestamp"].timestamp() * 1_000_000
        assert abs(micros - int(want["timestamp_ms"]) * 1000) < 2  # float rounding only
        assert row.get("headers") == (want["headers"] if include_headers else None)
    assert result.next_offset >= low
    if rows:
        assert result.next_offset > rows[-1]["offset"]


def test_decode_fetch_refuses_a_batch_at_or_above_the_high_watermark() -> None:
    batch = encode_batch([RecordInput(None, b"v", 1)] * 3, base_offset=10)
    with pytest.raises(ClientError, match="not below the high watermark 12"):
        decode_fetch(
            batch,
            topic="t",
            partition=0,
            offset_from=0,
            offset_to=20,
            high_watermark=12,
            include_headers=False,
        )


def test_decode_fetch_refuses_corrupt_bytes() -> None:
    batch = bytearray(encode_batch([RecordInput(b"k", b"value", 1)] * 4, base_offset=0))
    batch[-3] ^= 0xFF  # CRC32C no longer matches
    with pytest.raises(CorruptBatchError):
        decode_fetch(
            bytes(batch),
            topic="t",
            partition=0,
            offset_from=0,
            offset_to=9,
            high_watermark=9,
            include_headers=False,
        )


def test_decode_fetch_skips_control_batches_but_consumes_their_offsets() -> None:
    data = encode_control_batch(CONTROL_LEADER_CHANGE, b"x", timestamp_ms=1, base_offset=0)
    result = decode_fetch(
        data,
        topic="t",
        partition=0,
        offset_from=0,
        offset_to=5,
        high_watermark=1,
        include_headers=False,
    )
    assert result.batch is None and result.next_offset == 1


# -- admission control --------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _reader(clock: _Clock, **extra: str) -> Any:
    from raftlog.connectors.spark.source import RaftlogStreamReader

    options = parse_source_options({"bootstrap": BOOT, "subscribe": "t", **extra}, streaming=True)
    return RaftlogStreamReader(options, clock=clock)


def test_admission_min_offsets_waits_until_max_trigger_delay() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMinRows

    clock = _Clock()
    reader = _reader(clock, minOffsetsPerTrigger="100", maxTriggerDelay="30s")
    assert isinstance(reader.getDefaultReadLimit(), ReadMinRows)
    tp = TopicPartition("t", 0)
    begin, latest = {tp: 10}, {tp: 60}  # a backlog of 50 < 100
    assert reader.admit(begin, latest, ReadMinRows(100)) == begin
    clock.now_s += 29.9
    assert reader.admit(begin, latest, ReadMinRows(100)) == begin
    clock.now_s += 0.2  # 30 s since the last batch: go with what there is
    assert reader.admit(begin, latest, ReadMinRows(100)) == latest
    # ReadAllAvailable (e.g. Trigger.Once) ignores the options' limits.
    assert reader.admit(begin, latest, ReadAllAvailable()) == latest


def test_admission_max_offsets_caps_the_batch() -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    reader = _reader(_Clock(), maxOffsetsPerTrigger="30")
    assert reader.getDefaultReadLimit() == ReadMaxRows(30)
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    end = reader.admit({a: 0, b: 0}, {a: 100, b: 20}, ReadMaxRows(30))
    assert sum(end.values()) == 30 and end[a] <= 100 and end[b] <= 20


def test_stream_reader_pickles_to_plain_options() -> None:
    reader = _reader(_Clock())
    reader.view()  # a driver-side connection object exists ...
    clone = pickle.loads(pickle.dumps(reader))  # ... but workers receive only the options
    assert clone.options == reader.options and clone.__getstate__() == {"options": reader.options}
    reader.stop()


def test_decode_fetch_steps_over_the_gaps_of_a_compacted_log() -> None:
    from raftlog.storage.compaction import clean_batch

    records = [RecordInput(b"k%d" % (i % 2), b"v%d" % i, 5) for i in range(4)]
    gapped, _ = clean_batch(encode_batch(records, base_offset=10), lambda o, *_: o % 2 == 1)
    emptied, _ = clean_batch(encode_batch(records, base_offset=14), lambda *_: False)
    last, _ = clean_batch(encode_batch(records, base_offset=18), lambda o, *_: o == 18)
    result = decode_fetch(
        gapped + emptied + last,
        topic="t",
        partition=0,
        offset_from=0,
        offset_to=100,
        high_watermark=22,
        include_headers=False,
    )
    assert result.batch is not None and result.next_offset == 22
    rows = result.batch.to_pylist()
    assert [(r["offset"], r["value"]) for r in rows] == [(11, b"v1"), (13, b"v3"), (18, b"v0")]
    only_empty = decode_fetch(
        emptied, topic="t", partition=0, offset_from=0, offset_to=100, high_watermark=22,
        include_headers=False,
    )  # fmt: skip
    assert only_empty.next_offset == 18
    assert only_empty.batch is None or only_empty.batch.num_rows == 0


def _marker(*, commit: bool, producer_id: int, offset: int) -> bytes:
    marker = bytearray(
        encode_txn_marker(
            commit=commit, producer_id=producer_id, producer_epoch=0, coordinator_epoch=1,
            timestamp_ms=1,
        )
    )  # fmt: skip
    patch_base_offset_and_epoch(marker, 0, base_offset=offset, leader_epoch=0)
    return bytes(marker)


def test_decode_fetch_leaves_out_aborted_transactions_and_their_markers() -> None:
    """Producer 5's transaction (offsets 0-1 and 4) is aborted, producer 6's (2-3) committed,
    interleaved as on a partition; a plain record follows the markers. Reading from offset 1
    (inside the aborted run) still leaves all of it out."""

    def txn(producer_id: int, values: list[bytes], offset: int) -> bytes:
        return encode_batch(
            [RecordInput(None, v, 1) for v in values], base_offset=offset,
            producer_id=producer_id, producer_epoch=0, base_sequence=offset,
            is_transactional=True,
        )  # fmt: skip

    data = b"".join(
        [
            txn(5, [b"aborted-0", b"aborted-1"], 0),
            txn(6, [b"committed-2", b"committed-3"], 2),
            txn(5, [b"aborted-4"], 4),
            _marker(commit=False, producer_id=5, offset=5),
            _marker(commit=True, producer_id=6, offset=6),
            encode_batch([RecordInput(None, b"plain-7", 1)], base_offset=7),
        ]
    )
    for offset_from in (0, 1):
        result = decode_fetch(
            data, topic="t", partition=0, offset_from=offset_from, offset_to=8,
            high_watermark=8, include_headers=False, aborted=[(5, 0)],
        )  # fmt: skip
        assert result.batch is not None and result.next_offset == 8
        rows = [(r["offset"], r["value"]) for r in result.batch.to_pylist()]
        assert rows == [(2, b"committed-2"), (3, b"committed-3"), (7, b"plain-7")]
    everything = decode_fetch(
        data, topic="t", partition=0, offset_from=0, offset_to=8, high_watermark=8,
        include_headers=False,
    )  # fmt: skip
    assert everything.batch is not None
    assert [r["offset"] for r in everything.batch.to_pylist()] == [0, 1, 2, 3, 4, 7]


def test_isolation_level_defaults_to_read_committed() -> None:
    base = {"bootstrap": BOOT, "subscribe": "t"}
    assert parse_source_options(base, streaming=False).read_committed
    uncommitted = {**base, "isolationlevel": "READ_UNCOMMITTED"}
    assert not parse_source_options(uncommitted, streaming=False).read_committed
    with pytest.raises(ConfigError, match=r"^isolationLevel: must be read_committed or"):
        parse_source_options({**base, "isolationlevel": "committed"}, streaming=False)
