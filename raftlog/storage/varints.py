"""Kafka's zig-zag varints (varint: int32, at most 5 bytes; varlong: int64, 10) and plain
unsigned varints. One- and two-byte varints take a fast path and the encoder reads the
varints of 0..8191 from a table: record lengths and deltas are nearly always that small."""

from __future__ import annotations

from raftlog.errors import CorruptBatchError
from raftlog.storage.record_format import (
    INT64,
    ONE_BYTE_VARINTS,
    VARINT_BYTES_MAX,
    VARLONG_BYTES_MAX,
    Malformed,
)

__all__ = [
    "SMALL_VARINTS",
    "SMALL_VARINTS_LIMIT",
    "decode_varint",
    "encode_unsigned_varint",
    "encode_varint",
    "read_varint",
    "read_varint_multibyte",
]


def encode_varint(value: int) -> bytes:
    """Zig-zag varint of a signed 64-bit integer (Kafka's varint and varlong)."""
    assert INT64[0] <= value <= INT64[1], value
    zigzag = (value << 1) ^ (value >> 63)
    if zigzag < 0x80:
        return ONE_BYTE_VARINTS[zigzag]
    if zigzag < 0x4000:
        return bytes((zigzag & 0x7F | 0x80, zigzag >> 7))
    return encode_unsigned_varint(zigzag)


def encode_unsigned_varint(value: int) -> bytes:
    """Plain base-128 varint of a non-negative integer (protobuf's lengths and tags, Kafka's
    unsigned varints): seven bits a byte, low first, the high bit set on all but the last."""
    assert 0 <= value < 2**64, value
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Varints of the numbers 0..8191 (one or two bytes), built once (about 350 KiB): a record's
# lengths and deltas are nearly always among them, and a table read costs less than a build.
SMALL_VARINTS_LIMIT = 8192
SMALL_VARINTS = tuple(encode_varint(number) for number in range(SMALL_VARINTS_LIMIT))


def decode_varint(
    data: bytes, position: int = 0, *, bytes_max: int = VARLONG_BYTES_MAX
) -> tuple[int, int]:
    """Decode a zig-zag varint at `position`: `(value, next_position)`.

    Raises `CorruptBatchError` naming the position for a truncated or over-long varint.
    """
    assert bytes_max in (VARINT_BYTES_MAX, VARLONG_BYTES_MAX), bytes_max
    try:
        return read_varint(data, position, bytes_max)
    except IndexError:
        raise CorruptBatchError("truncated varint", position=position) from None
    except Malformed as error:
        raise CorruptBatchError(error.reason, position=error.at) from None


def read_varint(data: bytes, pos: int, bytes_max: int) -> tuple[int, int]:
    # An IndexError here means the varint runs off the end of `data`; callers catch it.
    byte = data[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    # Two bytes hold zig-zag values below 16384: KiB-sized lengths and most deltas.
    second = data[pos + 1]
    if second < 0x80:
        zigzag = (byte & 0x7F) | (second << 7)
        return (zigzag >> 1) ^ -(zigzag & 1), pos + 2
    return read_varint_multibyte(data, pos, bytes_max)


def read_varint_multibyte(data: bytes, start: int, bytes_max: int) -> tuple[int, int]:
    zigzag = 0
    shift = 0
    pos = start
    while True:
        if pos - start == bytes_max:
            raise Malformed(f"varint longer than {bytes_max} bytes", start)
        byte = data[pos]
        zigzag |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            break
        shift += 7
    bits = 32 if bytes_max == VARINT_BYTES_MAX else 64
    if zigzag >> bits:
        raise Malformed(f"varint overflows {bits} bits", start)
    assert pos - start <= bytes_max
    return (zigzag >> 1) ^ -(zigzag & 1), pos
