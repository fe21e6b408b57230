"""Kafka RecordBatch v2 records: build batches from records and read records back out.

Theory of operation. `raftlog.storage.batch` owns the 61-byte header and the CRC; this module
owns what follows it. Clients call it (producers encode, consumers decode); the broker path
never does, it only verifies and patches headers. After the header come `record_count`
records, compressed as one stream when the codec bits say so (`raftlog.storage.compression`).
Each record is, with zig-zag varints (varint: int32, at most 5 bytes; varlong: int64, 10):

    length          varint   bytes of the record after this field
    attributes      int8     unused in v2, written as 0
    timestampDelta  varlong  timestamp - batch first_timestamp
    offsetDelta     varint   offset - batch base_offset
    keyLength       varint   -1 = null key
    key             bytes
    valueLength     varint   -1 = null value
    value           bytes
    headersCount    varint
    headers         headersCount x (keyLength varint, key utf-8,
                                    valueLength varint (-1 = null), value)

Encoding gives record i the offset delta i, so `last_offset_delta = count - 1`; the batch's
first_timestamp is the *smallest* record timestamp (deltas are never negative) and
max_timestamp the largest. A worked example: records at 1000, 990 and 1005 ms encode
first_timestamp 990, max_timestamp 1005 and deltas 10, 0, 15.

Decoding trusts nothing: after `verify_batch` (length, magic, CRC) every varint is bounded in
size and range, every length is checked against the end of its record, a record's fields must
fill exactly its length, the header's `record_count` must match the records present with no
trailing bytes, offset deltas must rise within `[0, last_offset_delta]` (compaction may leave
gaps) and a compressed section may expand to at most `decompressed_bytes_max` bytes. Every
rejection is a `CorruptBatchError` whose `position` is the absolute byte in the buffer where the
fault lies, or, for a compressed batch, the batch's own position, the reason then naming the
byte within the decompressed records. Under LOG_APPEND_TIME (timestamp type 1) every record
reads as the batch's max_timestamp, as Kafka defines it.

Validation without decoding: `validate_records` walks the same framing (varint lengths,
offset deltas, header counts, UTF-8 header keys, decompression within its bound) and accepts
exactly the batches `decode_batch` accepts, without building a `Record` or slicing a key or a
value. The leader runs it once on a client's produce so that no bytes a consumer cannot
decode are ever stored and served; replication and fetch never run it.

Where each part lives: `record_format` (field ranges, types), `varints`, `record_encoder`,
`record_decoder`, `record_validation` and `control_batches`; this module re-exports their
public names, the one place clients and the broker import from.

Control batches (attribute bit 5) carry one record whose key is version int16 + type int16,
big-endian, and whose value is the type's payload: a new Raft leader's no-op is a
LEADER_CHANGE batch, a membership change a VOTERS batch (as in Kafka's KRaft).

Speed (clients run this in Python, per record): varints of one and two bytes take a fast
path, and the encoder reads the varints of 0..8191 from a table; records are joined from their
parts a chunk of about 32 KiB at a time and the CRC runs chunk by chunk, so the batch is
assembled by a single join of the chunks; uncompressed `bytes` are parsed in place, keys and
values sliced straight out of the buffer. Big fresh buffers are avoided because on this class
of machine a megabyte of new pages costs more in page faults than the bytes cost to move.
"""

from __future__ import annotations

from raftlog.storage.control_batches import (
    TxnMarkerRecord,
    decode_control_batch,
    decode_txn_marker,
    encode_control_batch,
    encode_txn_marker,
)
from raftlog.storage.record_decoder import decode_batch, decode_batch_fields
from raftlog.storage.record_encoder import encode_batch
from raftlog.storage.record_format import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CONTROL_KEY_VERSION,
    CONTROL_LEADER_CHANGE,
    CONTROL_VOTERS,
    DecodedBatch,
    Headers,
    Record,
    RecordFields,
    RecordInput,
    RecordOutFields,
)
from raftlog.storage.record_validation import validate_records
from raftlog.storage.varints import decode_varint, encode_unsigned_varint, encode_varint

__all__ = [
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "CONTROL_KEY_VERSION",
    "CONTROL_LEADER_CHANGE",
    "CONTROL_VOTERS",
    "DecodedBatch",
    "Headers",
    "Record",
    "RecordFields",
    "RecordInput",
    "RecordOutFields",
    "TxnMarkerRecord",
    "decode_batch",
    "decode_batch_fields",
    "decode_control_batch",
    "decode_txn_marker",
    "decode_varint",
    "encode_batch",
    "encode_control_batch",
    "encode_txn_marker",
    "encode_unsigned_varint",
    "encode_varint",
    "validate_records",
]
