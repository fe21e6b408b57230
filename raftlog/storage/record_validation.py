"""Validation without decoding (the leader's produce path): `validate_records` walks the
records' framing as `decode_batch` checks it and accepts exactly the batches it accepts,
without building a record or slicing a key or a value."""

from __future__ import annotations

from collections.abc import Callable

from raftlog.errors import CorruptBatchError, InvalidRecordError
from raftlog.storage.batch import BATCH_HEADER_BYTES, BatchHeader, Compression
from raftlog.storage.compression import CompressionError
from raftlog.storage.record_decoder import records_section
from raftlog.storage.record_format import (
    DEFAULT_DECOMPRESSED_BYTES_MAX,
    RECORD_BYTES_MIN,
    VARINT_BYTES_MAX,
    VARLONG_BYTES_MAX,
    Malformed,
)
from raftlog.storage.varints import read_varint

__all__ = ["validate_records"]


def validate_records(
    batch: bytes,
    header: BatchHeader,
    *,
    decompressed_bytes_max: int = DEFAULT_DECOMPRESSED_BYTES_MAX,
    keys_required: bool = False,
) -> None:
    """Check that the records of `batch` (one batch at position 0, already CRC-verified into
    `header`) are well framed: `decode_batch` would return `header.record_count` records.

    Raises `CorruptBatchError` naming the record index and the byte of the fault (absolute in
    `batch`; for a compressed batch the byte within the decompressed records). With
    `keys_required` (a compacted topic) the same walk also finds every record whose key is
    null; a batch holding any is refused with `InvalidRecordError` naming each one
    (`record_errors`: Kafka's per-record errors).
    """
    assert header.size_bytes == len(batch), (header.size_bytes, len(batch))
    codec = header.compression
    keyless: list[int] = []
    try:
        data, begin, stop = records_section(
            batch, BATCH_HEADER_BYTES, len(batch), codec, decompressed_bytes_max
        )
        if keys_required:
            _walk_records(data, begin, stop, header, _keyed_record_skipper(keyless))
        else:
            _walk_records(data, begin, stop, header)
    except CompressionError as error:
        raise CorruptBatchError(str(error), position=0) from None
    except Malformed as error:
        if codec is Compression.NONE:
            at = error.at + BATCH_HEADER_BYTES - begin
            raise CorruptBatchError(error.reason, position=at) from None
        reason = f"{error.reason} (at byte {error.at} of the {codec.name}-decompressed records)"
        raise CorruptBatchError(reason, position=0) from None
    if keyless:
        raise _keyless_error(keyless)


_NOT_PLAIN = (0, -1)
_RECORD_ERRORS_SHOWN = 3  # in the message; record_errors names every one


def _keyless_error(keyless: list[int]) -> InvalidRecordError:
    """The refusal of a batch whose records at the indexes `keyless` have no key."""
    why = (
        "has no key: a compacted topic (cleanup.policy=compact) keeps the latest record of "
        "each key and refuses records without one"
    )
    record_errors = tuple((index, f"record {index} {why}") for index in keyless)
    shown = "; ".join(message for _, message in record_errors[:_RECORD_ERRORS_SHOWN])
    return InvalidRecordError(
        f"{len(keyless)} records of the batch refused (at most {_RECORD_ERRORS_SHOWN} shown): "
        f"{shown}",
        record_errors=record_errors,
    )


def _keyed_record_skipper(keyless: list[int]) -> Callable[[bytes, int, int], tuple[int, int]]:
    """A `skip_plain` for `_walk_records` that also appends to `keyless` the index of each
    record whose key is null. The walk offers it every record once, in order, so its calls
    count the index."""
    index = -1

    def skip(data: bytes, start: int, limit: int) -> tuple[int, int]:
        """`_skip_record`, noting a null key: the key length follows the record length,
        attributes, timestamp delta and offset delta."""
        nonlocal index
        index += 1
        try:
            offset_delta, end = _skip_record(data, start, limit)
        except (IndexError, Malformed):
            return _NOT_PLAIN  # the walk checks the record again and names the fault
        _, pos = read_varint(data, start, VARINT_BYTES_MAX)  # length
        _, pos = read_varint(data, pos + 1, VARLONG_BYTES_MAX)  # after the attributes
        _, pos = read_varint(data, pos, VARINT_BYTES_MAX)  # offset delta
        key_length, _ = read_varint(data, pos, VARINT_BYTES_MAX)
        if key_length == -1:
            keyless.append(index)
        return offset_delta, end

    return skip


def _skip_plain_record(data: bytes, start: int, limit: int) -> tuple[int, int]:
    """`(offset_delta, end)` of the record at `start` if it is *plain* (varints of one or two
    bytes, key and value null or of a non-negative length, no headers: what producers send)
    and well framed within `limit`; `_NOT_PLAIN` (end -1) otherwise, for `_skip_record` to
    decide and explain. It runs on every produced record, so each field is read inline: a
    call per field cost more than the fields. Any test that fails, or an IndexError (a field
    past the end of `data`), means not plain; so this only decides quickly what
    `_skip_record` would decide, and every refusal comes from `_skip_record`."""
    try:
        byte = data[start]
        if byte < 0x80:
            zigzag, at = byte, start + 1
        elif data[start + 1] < 0x80:
            zigzag, at = (byte & 0x7F) | (data[start + 1] << 7), start + 2
        else:
            return _NOT_PLAIN
        end = at + (zigzag >> 1)
        if zigzag & 1 or end > limit:
            return _NOT_PLAIN  # a negative length, or one past the records
        at += 1  # attributes
        at += 1 if data[at] < 0x80 else 2 if data[at + 1] < 0x80 else limit  # timestampDelta
        byte = data[at]
        if byte < 0x80:
            offset_delta, at = (byte >> 1) ^ -(byte & 1), at + 1
        elif data[at + 1] < 0x80:
            zigzag = (byte & 0x7F) | (data[at + 1] << 7)
            offset_delta, at = (zigzag >> 1) ^ -(zigzag & 1), at + 2
        else:
            return _NOT_PLAIN
        for _ in _KEY_VALUE:  # their lengths: -1 is null, any other negative a fault
            byte = data[at]
            if byte < 0x80:
                at += 1 if byte == 1 else limit if byte & 1 else 1 + (byte >> 1)
            elif data[at + 1] < 0x80 and not byte & 1:
                at += 2 + (((byte & 0x7F) | (data[at + 1] << 7)) >> 1)
            else:
                return _NOT_PLAIN
        if at + 1 != end or data[at] != 0:  # one byte of header count, saying none
            return _NOT_PLAIN
    except IndexError:
        return _NOT_PLAIN
    return offset_delta, end


def _walk_records(
    data: bytes,
    begin: int,
    end: int,
    header: BatchHeader,
    skip_plain: Callable[[bytes, int, int], tuple[int, int]] = _skip_plain_record,
) -> None:
    """`record_decoder._decode_records`' checks, building nothing; `Malformed` names the
    record index.

    Each record is first offered to `skip_plain` (`_skip_plain_record`, the fast path for
    what producers send); a record it does not take goes to `_skip_record`, which accepts or
    refuses it, naming the fault. A `skip_plain` that takes nothing gives the plain
    per-record walk (the tests compare the two).
    """
    assert 0 <= begin <= end <= len(data), (begin, end, len(data))
    count = header.record_count
    if count > (end - begin) // RECORD_BYTES_MIN:
        raise Malformed(f"record_count {count} cannot fit in {end - begin} bytes of records", begin)
    pos = begin
    previous_delta = -1
    last_offset_delta = header.last_offset_delta
    for index in range(count):
        if pos == end:
            raise Malformed(f"record_count is {count} but the records end after {index}", pos)
        offset_delta, record_end = skip_plain(data, pos, end)
        if record_end < 0:
            try:
                offset_delta, record_end = _skip_record(data, pos, end)
            except IndexError:
                raise Malformed(f"record {index} runs past the end of the records", pos) from None
            except Malformed as error:
                raise Malformed(f"record {index}: {error.reason}", error.at) from None
        if not previous_delta < offset_delta <= last_offset_delta:
            raise Malformed(
                f"record {index} has offset delta {offset_delta}, outside "
                f"({previous_delta}, {last_offset_delta}]",
                pos,
            )
        previous_delta = offset_delta
        pos = record_end
    if pos != end:
        raise Malformed(
            f"{end - pos} trailing bytes after the {count} records of record_count", pos
        )


_KEY_VALUE = ("key", "value")


def _skip_record(data: bytes, start: int, limit: int) -> tuple[int, int]:
    """`(offset_delta, end)` of the record at `start`, checked as
    `record_decoder._decode_record` checks it."""
    read = read_varint
    length, pos = read(data, start, VARINT_BYTES_MAX)
    end = pos + length
    if length < 0 or end > limit:
        raise Malformed(f"record length {length} does not fit the {limit - pos} bytes left", start)
    body = pos
    _, pos = read(data, pos + 1, VARLONG_BYTES_MAX)  # after the attributes: timestampDelta
    offset_delta, pos = read(data, pos, VARINT_BYTES_MAX)
    # Key then value, inline: `_skip_nullable` for each would cost a call per field.
    for field in _KEY_VALUE:
        field_at = pos
        field_length, pos = read(data, pos, VARINT_BYTES_MAX)
        if field_length >= 0:
            pos += field_length
        if field_length < -1 or pos > end:
            pos = _skip_nullable(data, field_at, end, field)  # raises, naming the fault
    header_count_at = pos
    header_count, pos = read(data, pos, VARINT_BYTES_MAX)
    if header_count:
        if not 0 <= header_count <= (end - pos) // 2:
            raise Malformed(
                f"header count {header_count} does not fit the {end - pos} bytes left",
                header_count_at,
            )
        pos = _skip_headers(data, pos, end, header_count)
    if pos != end:
        raise Malformed(f"record length is {length} but its fields take {pos - body}", start)
    return offset_delta, end


def _skip_nullable(data: bytes, at: int, end: int, field: str) -> int:
    length, pos = read_varint(data, at, VARINT_BYTES_MAX)
    if length < 0:
        if length == -1:
            return pos
        raise Malformed(f"{field} length {length} is negative", at)
    if pos + length > end:
        raise Malformed(f"{field} length {length} runs past the end of its record", at)
    return pos + length


def _skip_headers(data: bytes, pos: int, end: int, count: int) -> int:
    # Header keys are the one field a consumer turns into text, so they are decoded here too.
    assert 0 < count <= (end - pos) // 2, (count, end, pos)
    for _ in range(count):
        key_at = pos
        length, key_start = read_varint(data, pos, VARINT_BYTES_MAX)
        if length == -1:
            raise Malformed("header key is null", key_at)
        pos = _skip_nullable(data, pos, end, "header key")
        try:
            data[key_start:pos].decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed(f"header key {data[key_start:pos]!r} is not UTF-8", key_start) from None
        pos = _skip_nullable(data, pos, end, "header value")
    return pos
