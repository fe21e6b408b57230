"""Control batches (attribute bit 5): one record whose key is version int16 + type int16,
big-endian, and whose value is the type's payload. A new Raft leader's no-op is a
LEADER_CHANGE batch, a membership change a VOTERS batch (as in Kafka's KRaft).

A transaction marker is Kafka's: a control batch that is also transactional (bits 4 and 5),
carrying the producer's id and epoch (no sequence), of one record whose key type is ABORT (0)
or COMMIT (1) and whose value is Kafka's EndTransactionMarker: version int16 (0) and the
coordinator epoch int32. Unlike Raft's own entries it takes a Kafka offset and reaches
clients, which recognise it by its attributes."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from raftlog.errors import CorruptBatchError
from raftlog.storage.batch import ATTR_CONTROL, ATTR_TRANSACTIONAL
from raftlog.storage.record_decoder import decode_batch
from raftlog.storage.record_encoder import build_batch, require_range
from raftlog.storage.record_format import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CONTROL_KEY,
    CONTROL_KEY_VERSION,
    INT16,
    RecordInput,
)

__all__ = [
    "TxnMarkerRecord",
    "decode_control_batch",
    "decode_txn_marker",
    "encode_control_batch",
    "encode_txn_marker",
]

_END_TXN_MARKER = struct.Struct(">hi")  # version, coordinator epoch
_END_TXN_MARKER_VERSION = 0


def encode_control_batch(
    control_type: int,
    value: bytes,
    *,
    timestamp_ms: int,
    base_offset: int = 0,
    leader_epoch: int = 0,
) -> bytes:
    """A control batch of one record: key = (CONTROL_KEY_VERSION, control_type), the value."""
    require_range("control_type", control_type, INT16)
    key = CONTROL_KEY.pack(CONTROL_KEY_VERSION, control_type)
    record = RecordInput(key, value, timestamp_ms)
    return build_batch(
        (record,),
        attributes=ATTR_CONTROL,
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        producer=(-1, -1, -1),
    )


def decode_control_batch(
    buf: bytes | bytearray | memoryview, position: int = 0, *, path: str | None = None
) -> tuple[int, bytes]:
    """The `(control_type, value)` of the control batch at `position`.

    Raises `CorruptBatchError` if it is not a control batch of one well-formed control record.
    """
    batch = decode_batch(buf, position, path=path)
    if not batch.header.is_control or batch.header.record_count != 1:
        raise CorruptBatchError(
            f"not a control batch of one record (control={batch.header.is_control}, "
            f"record_count={batch.header.record_count})",
            path=path,
            position=position,
        )
    record = batch.records[0]
    if record.key is None or len(record.key) != CONTROL_KEY.size or record.value is None:
        raise CorruptBatchError(
            f"control record needs a {CONTROL_KEY.size}-byte key and a value, got key "
            f"{record.key!r} and {'no' if record.value is None else 'a'} value",
            path=path,
            position=position,
        )
    version, control_type = CONTROL_KEY.unpack(record.key)
    if version < 0:
        raise CorruptBatchError(
            f"control record key version {version} is negative", path=path, position=position
        )
    return control_type, record.value


@dataclass(frozen=True, slots=True)
class TxnMarkerRecord:
    """What a transaction marker says (its producer id and epoch are the batch's)."""

    commit: bool
    coordinator_epoch: int


def encode_txn_marker(
    *,
    commit: bool,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp_ms: int,
) -> bytes:
    """A COMMIT or ABORT marker batch (module docstring); the log patches its base offset."""
    assert producer_id >= 0 and producer_epoch >= 0 and coordinator_epoch >= 0
    control_type = CONTROL_COMMIT if commit else CONTROL_ABORT
    key = CONTROL_KEY.pack(CONTROL_KEY_VERSION, control_type)
    value = _END_TXN_MARKER.pack(_END_TXN_MARKER_VERSION, coordinator_epoch)
    return build_batch(
        (RecordInput(key, value, timestamp_ms),),
        attributes=ATTR_CONTROL | ATTR_TRANSACTIONAL,
        base_offset=0,
        leader_epoch=0,
        producer=(producer_id, producer_epoch, -1),
    )


def decode_txn_marker(buf: bytes | bytearray | memoryview) -> TxnMarkerRecord | None:
    """The marker `buf` holds, None if it is another control batch; raises CorruptBatchError
    if it is no well-formed control batch."""
    control_type, value = decode_control_batch(buf)
    if control_type not in (CONTROL_ABORT, CONTROL_COMMIT):
        return None
    if len(value) < _END_TXN_MARKER.size:
        raise CorruptBatchError(f"transaction marker value of {len(value)} bytes")
    version, coordinator_epoch = _END_TXN_MARKER.unpack_from(value)
    if version < 0:
        raise CorruptBatchError(f"transaction marker value version {version}")
    return TxnMarkerRecord(control_type == CONTROL_COMMIT, coordinator_epoch)
