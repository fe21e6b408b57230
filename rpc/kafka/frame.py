"""Kafka's framing, sans I/O: size-prefixed frames in, request headers and bodies out.

Theory of operation. Every Kafka request and response is a frame: a big-endian int32 size,
then that many bytes. A request frame starts with its header: api key (int16), api version
(int16), correlation id (int32) and a nullable client id (int16 length, -1 for null); a
*flexible* request (header v2, KIP-482) ends the header with tagged fields. The fixed first
eight bytes are read before anything else, so even a request for an unknown API or version
names the correlation id its error goes back under. A response frame starts with the
correlation id, then (flexible responses other than ApiVersions', header v1) an empty
tagged-field section.

`FrameDecoder` takes bytes as they arrive and hands out whole frames; a size below the
smallest header or above `frame_bytes_max` is a `FrameError`, after which the connection is
closed (as Kafka does: the rest of the stream can no longer be framed). Bodies are decoded
by the kio library (generated from Kafka's JSON message schemas); a body that does not
decode (a field or length running past the frame, a bad varint or string) is a `FrameError`
too: nothing is done for a request that did not decode cleanly. Bytes left after a whole
body are ignored, as Kafka's brokers ignore them (librdkafka's AdminClient sends Metadata v12
with three such bytes).
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Any

from kio.serial.errors import SerialError
from kio.serial.readers import read_unsigned_varint

__all__ = [
    "HEADER_FIXED_BYTES",
    "FrameDecoder",
    "FrameError",
    "RequestHeader",
    "decode_body",
    "decode_header",
    "response_frame",
]

HEADER_FIXED_BYTES = 8  # api key, api version, correlation id
_SIZE = struct.Struct(">i")
_FIXED = struct.Struct(">hhi")
_CLIENT_ID_LENGTH = struct.Struct(">h")
_TAGGED_FIELDS_MAX = 64  # a header with more is not one a client sends
_DECODE_ERRORS = (SerialError, ValueError, OverflowError, TypeError, IndexError, KeyError)


class FrameError(Exception):
    """The stream cannot be read further: the connection is closed."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class FrameDecoder:
    """Bytes in, whole frames out; bounded by `frame_bytes_max` (the frame, size excluded)."""

    __slots__ = ("_buffer", "_frame_bytes_max")

    def __init__(self, *, frame_bytes_max: int) -> None:
        assert frame_bytes_max >= HEADER_FIXED_BYTES
        self._buffer = bytearray()
        self._frame_bytes_max = frame_bytes_max

    def receive_data(self, data: bytes) -> None:
        """Append `data` to the buffer; `next_frame` hands out what it completes."""
        self._buffer += data

    def buffered_bytes(self) -> int:
        """How many received bytes no frame has taken yet."""
        return len(self._buffer)

    def next_frame(self) -> bytes | None:
        """The next whole frame, or None until more bytes arrive."""
        if len(self._buffer) < _SIZE.size:
            return None
        (size,) = _SIZE.unpack_from(self._buffer)
        if not HEADER_FIXED_BYTES <= size <= self._frame_bytes_max:
            raise FrameError(
                f"frame size {size} outside [{HEADER_FIXED_BYTES}, {self._frame_bytes_max}] "
                "(kafka.frame_bytes_max)"
            )
        end = _SIZE.size + size
        if len(self._buffer) < end:
            return None
        frame = bytes(self._buffer[_SIZE.size : end])
        del self._buffer[:end]
        assert len(frame) == size
        return frame


def decode_header(frame: bytes, *, flexible: bool) -> tuple[RequestHeader, int]:
    """The request header and the offset its body starts at. `flexible`: header v2."""
    if len(frame) < HEADER_FIXED_BYTES + _CLIENT_ID_LENGTH.size:
        raise FrameError(f"request header truncated: frame of {len(frame)} bytes")
    api_key, api_version, correlation_id = _FIXED.unpack_from(frame)
    offset = HEADER_FIXED_BYTES
    (length,) = _CLIENT_ID_LENGTH.unpack_from(frame, offset)
    offset += _CLIENT_ID_LENGTH.size
    client_id: str | None = None
    if length >= 0:
        if offset + length > len(frame):
            raise FrameError(f"client id of {length} bytes overruns a {len(frame)}-byte frame")
        try:
            client_id = frame[offset : offset + length].decode("utf-8")
        except UnicodeDecodeError as error:
            raise FrameError(f"client id is not UTF-8: {error}") from None
        offset += length
    elif length != -1:
        raise FrameError(f"client id length {length} is neither -1 (null) nor >= 0")
    if flexible:
        offset = _skip_tagged_fields(frame, offset)
    return RequestHeader(api_key, api_version, correlation_id, client_id), offset


def _skip_tagged_fields(frame: bytes, offset: int) -> int:
    try:
        count, used = read_unsigned_varint(frame, offset)
        offset += used
        if count > _TAGGED_FIELDS_MAX:
            raise FrameError(f"request header has {count} tagged fields")
        for _ in range(count):
            _tag, used = read_unsigned_varint(frame, offset)
            offset += used
            size, used = read_unsigned_varint(frame, offset)
            offset += used + size
            if offset > len(frame):
                raise FrameError("request header tagged field overruns the frame")
    except _DECODE_ERRORS as error:
        raise FrameError(f"request header tagged fields: {error}") from None
    return offset


def decode_body(frame: bytes, offset: int, reader: Any, *, what: str) -> Any:
    """The request body at `offset`, read with kio's `reader`, within the frame."""
    try:
        body, used = reader(frame, offset)
    except _DECODE_ERRORS as error:
        raise FrameError(f"{what}: body does not decode: {error}") from None
    assert offset + used <= len(frame), (what, offset, used, len(frame))
    null = _null_field(body)
    if null is not None:
        raise FrameError(f"{what}: body does not decode: {null} is null, which it may not be")
    return body


_REQUIRED_FIELDS: dict[type[Any], tuple[str, ...]] = {}


def _required_fields(cls: type[Any]) -> tuple[str, ...]:
    """The fields of a kio entity whose type does not admit None (kept per class)."""
    names = _REQUIRED_FIELDS.get(cls)
    if names is None:
        names = _REQUIRED_FIELDS[cls] = tuple(
            f.name
            for f in dataclasses.fields(cls)
            if type(None) not in getattr(f.type, "__args__", ()) and f.type is not type(None)
        )
    return names


def _null_field(entity: Any) -> str | None:
    """The first field, nested ones included, that holds None though its type does not admit
    it, else None. kio decodes a -1 array or string length as None whatever the schema says;
    a handler would then fail on it, so such a request is refused like any other that does
    not decode."""
    for name in _required_fields(type(entity)):
        value = getattr(entity, name)
        if value is None:
            return f"{type(entity).__name__}.{name}"
        if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            for item in value:
                null = _null_field(item)
                if null is not None:
                    return null
    return None


_EMPTY_TAGGED_FIELDS = b"\x00"


def response_frame(correlation_id: int, body: list[bytes], *, flexible: bool) -> list[bytes]:
    """The pieces of one response frame (size, header, body), for `writelines`."""
    header = struct.pack(">i", correlation_id)
    if flexible:
        header += _EMPTY_TAGGED_FIELDS
    size = len(header) + sum(len(chunk) for chunk in body)
    return [_SIZE.pack(size) + header, *body]
