"""Control batches (attribute bit 5): one record whose key is version int16 + type int16,
big-endian, and whose value is the type's payload. A new Raft leader's no-op is a
LEADER_CHANGE batch, a membership change a VOTERS batch (as in Kafka's KRaft)."""

from __future__ import annotations

from raftlog.errors import CorruptBatchError
from raftlog.storage.batch import ATTR_CONTROL
from raftlog.storage.record_decoder import decode_batch
from raftlog.storage.record_encoder import build_batch, require_range
from raftlog.storage.record_format import CONTROL_KEY, CONTROL_KEY_VERSION, INT16, RecordInput

__all__ = ["decode_control_batch", "encode_control_batch"]


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
