"""A compacted topic refuses records without a key (Kafka's INVALID_RECORD), before anything
of the request is proposed; the check rides on the produce path's one walk of the records
(`validate_records(keys_required=True)`), and only compacted topics pay for it."""

from __future__ import annotations

import asyncio

import pytest

from raftlog.errors import CorruptBatchError, InvalidRecordError
from raftlog.storage.batch import CRC_START, Compression, crc32c, verify_batch
from raftlog.storage.records import RecordInput, encode_batch, validate_records
from raftlog.types import Commitment
from tests.unit.partition.replica_groups import ReplicaGroups


def _batch(*keys: bytes | None, compression: Compression = Compression.NONE) -> bytes:
    return encode_batch([RecordInput(k, b"v", 0) for k in keys], compression=compression)


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP, Compression.LZ4])
def test_validation_refuses_a_null_key_only_when_keys_are_required(
    compression: Compression,
) -> None:
    batch = _batch(b"a", None, b"c", None, compression=compression)
    validate_records(batch, verify_batch(batch))
    with pytest.raises(
        InvalidRecordError, match=r"2 records .*record 1 has no key.*record 3"
    ) as raised:
        validate_records(batch, verify_batch(batch), keys_required=True)
    # Every keyless record is named by its index in the batch (Kafka's record_errors).
    assert [index for index, _ in raised.value.record_errors] == [1, 3]
    assert "cleanup.policy" in raised.value.record_errors[0][1]
    keyed = _batch(b"a", b"", b"c" * 300, compression=compression)  # an empty key is a key
    validate_records(keyed, verify_batch(keyed), keys_required=True)


def test_a_malformed_record_is_still_corrupt_when_keys_are_required() -> None:
    batch = bytearray(_batch(b"a"))
    batch[-3] = 0x7F  # the value's length now runs past the record
    batch[17:21] = crc32c(bytes(batch[CRC_START:])).to_bytes(4, "big")
    with pytest.raises(CorruptBatchError):
        validate_records(bytes(batch), verify_batch(bytes(batch)), keys_required=True)


def test_a_compacted_partition_refuses_a_keyless_record_before_proposing() -> None:
    async def scenario() -> None:
        partition = ReplicaGroups()
        leader = partition.leader
        leader._keys_required = lambda: True
        end = leader.group.node.last_offset
        with pytest.raises(InvalidRecordError):
            await leader.produce(
                [_batch(b"k"), _batch(b"k", None)], commitment=Commitment.LEADER, timeout_s=5
            )
        assert leader.group.node.last_offset == end  # not even the keyed batch went in
        produced = asyncio.ensure_future(
            leader.produce([_batch(b"k")], commitment=Commitment.QUORUM, timeout_s=5)
        )
        await asyncio.sleep(0)
        partition.settle()
        assert (await produced).base_offset == end + 1

    asyncio.run(scenario())
