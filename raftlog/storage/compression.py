"""Compression codecs of Kafka RecordBatch v2: what the records section of a batch may hold.

Theory of operation. When a batch's codec bits (attributes & 0x07) are not NONE, everything
after the 61-byte header is one compressed stream of the records, with no length prefix. We
write and read the same streams as Kafka clients:

    codec   stream                                   written with
    GZIP    RFC 1952 members (concatenation allowed)  stdlib zlib, mtime 0 (deterministic)
    SNAPPY  raw snappy, or xerial-framed blocks      cramjam; written xerial-framed in 32 KiB
            (librdkafka writes raw, the JVM framed)  blocks, as Kafka's JVM code writes it
    LZ4     LZ4 *frame* format, independent blocks   lz4.frame, as kafka-python writes it
    ZSTD    zstd frames                              zstandard, as kafka-python writes it

Decompression is bounded: a batch is at most `batch_bytes_max` on disk but could expand to
anything (a "zip bomb"), so every decoder stops after `decompressed_bytes_max + 1` bytes of
output and reports the excess instead of allocating it. Trailing bytes after the compressed
stream and truncated streams are corruption. Errors are raised as `CompressionError`, which
carries no position: `raftlog.storage.records` knows where the batch lies and re-raises it as
a `CorruptBatchError` naming the file and position.

Codec objects are created per call: they are cheap next to the data they process and this
keeps the module free of shared mutable state (safe from any thread).
"""

from __future__ import annotations

import zlib

import cramjam as _cramjam
import lz4.frame as _lz4_frame
import zstandard as _zstd

from raftlog.storage.batch import Compression

__all__ = ["CompressionError", "compress", "decompress"]

# Kafka's record batches use independent LZ4 blocks (the JVM client cannot read linked ones).
_LZ4_BLOCK_LINKED = False
# gzip's level as kafka-python writes it; zlib's own default (6) would be faster but the
# bytes would differ from what the reference client builds.
_GZIP_LEVEL = 9
_GZIP_WBITS = 16 + zlib.MAX_WBITS
# Decompressed output is produced at most this much at a time (decompressors allocate the
# whole allowance up front, so asking for `decompressed_bytes_max` at once is slow).
_DECOMPRESS_CHUNK_BYTES = 1 << 20
# The xerial snappy-java stream header (magic, version, compatible version) that Kafka's JVM
# client writes before its length-prefixed snappy blocks.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16
# Written after the magic: snappy-java's stream version and the oldest it is compatible with.
_XERIAL_VERSIONS = (1).to_bytes(4, "big") * 2
# snappy-java's default block: the uncompressed bytes each framed block holds at most.
_XERIAL_BLOCK_BYTES = 32 * 1024


class CompressionError(ValueError):
    """A compressed records section that cannot be decompressed within its bound."""


def compress(codec: Compression, data: bytes) -> bytes:
    """Compress a records section with `codec` (not NONE)."""
    assert codec is not Compression.NONE, "NONE is not a compression codec"
    if codec is Compression.LZ4:
        result: bytes = _lz4_frame.compress(data, block_linked=_LZ4_BLOCK_LINKED)
    elif codec is Compression.ZSTD:
        result = _zstd.ZstdCompressor().compress(data)
    elif codec is Compression.GZIP:
        result = _gzip_compress(data)
    elif codec is Compression.SNAPPY:
        result = _snappy_compress(data)
    else:
        raise ValueError(f"compression codec {codec.name} is not supported by raftlog")
    assert len(result) > 0, codec
    return result


def decompress(codec: Compression, data: bytes | memoryview, *, bytes_max: int) -> bytes:
    """Decompress a records section, refusing to produce more than `bytes_max` bytes.

    Raises `CompressionError` for a damaged, truncated or oversized stream, or a codec
    raftlog cannot read.
    """
    assert codec is not Compression.NONE, "NONE is not a compression codec"
    assert bytes_max >= 0, bytes_max
    try:
        if codec is Compression.LZ4:
            result = _lz4_decompress(data, bytes_max)
        elif codec is Compression.ZSTD:
            result = _zstd_decompress(data, bytes_max)
        elif codec is Compression.GZIP:
            result = _gzip_decompress(data, bytes_max)
        elif codec is Compression.SNAPPY:
            result = _snappy_decompress(bytes(data), bytes_max)
        else:
            raise CompressionError(
                f"compression codec {codec.name} ({int(codec)}) is not supported by raftlog"
            )
    except (RuntimeError, zlib.error, _zstd.ZstdError, _cramjam.DecompressionError) as error:
        raise CompressionError(f"{codec.name} stream is damaged: {error}") from None
    assert len(result) <= bytes_max, (len(result), bytes_max)
    return result


def _too_large(codec: str, bytes_max: int) -> CompressionError:
    return CompressionError(f"{codec} records expand past decompressed_bytes_max={bytes_max} bytes")


def _snappy_compress(data: bytes) -> bytes:
    """xerial framing, as Kafka's JVM producer and broker write snappy (every client reads
    it; librdkafka's raw form would leave the JVM's reader to guess the stream's kind)."""
    parts = [_XERIAL_MAGIC, _XERIAL_VERSIONS]
    for start in range(0, max(len(data), 1), _XERIAL_BLOCK_BYTES):
        block = bytes(_cramjam.snappy.compress_raw(data[start : start + _XERIAL_BLOCK_BYTES]))
        parts += [len(block).to_bytes(4, "big"), block]
    return b"".join(parts)


def _snappy_decompress(data: bytes, bytes_max: int) -> bytes:
    """Raw snappy, or xerial framing: a header, then [int32 BE length][raw block] repeated."""
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data, bytes_max)
    if len(data) < _XERIAL_HEADER_BYTES:
        raise CompressionError("SNAPPY xerial header is truncated")
    blocks: list[bytes] = []
    produced_bytes = 0
    cursor = _XERIAL_HEADER_BYTES
    # Each block consumes at least its 4-byte length, so the loop is bounded by the input.
    while cursor < len(data):
        if cursor + 4 > len(data):
            raise CompressionError("SNAPPY xerial block length is truncated")
        length = int.from_bytes(data[cursor : cursor + 4], "big")
        block = data[cursor + 4 : cursor + 4 + length]
        if length == 0 or len(block) < length:
            raise CompressionError("SNAPPY xerial block is empty or truncated")
        blocks.append(_snappy_block(block, bytes_max - produced_bytes))
        produced_bytes += len(blocks[-1])
        cursor += 4 + length
    if not blocks:
        raise CompressionError("SNAPPY xerial stream has no block")
    return b"".join(blocks)


def _snappy_block(data: bytes, bytes_max: int) -> bytes:
    # A raw snappy block states its length first: check it before allocating anything.
    length = _cramjam.snappy.decompress_raw_len(data)
    if length > bytes_max:
        raise _too_large("SNAPPY", bytes_max)
    result = bytes(_cramjam.snappy.decompress_raw(data))
    if len(result) != length:
        raise CompressionError("SNAPPY block is shorter than its stated length")
    return result


def _gzip_compress(data: bytes) -> bytes:
    # zlib with gzip wrapping writes mtime 0 and no file name: the same input always
    # gives the same bytes (gzip.compress would stamp the current time).
    compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
    return compressor.compress(data) + compressor.flush()


def _gzip_decompress(data: bytes | memoryview, bytes_max: int) -> bytes:
    chunks: list[bytes] = []
    produced_bytes = 0
    remaining = bytes(data)
    # Each member consumes at least its 18-byte header and trailer, so the loop is bounded
    # by the input size.
    while remaining:
        decompressor = zlib.decompressobj(_GZIP_WBITS)
        chunk = decompressor.decompress(remaining, bytes_max - produced_bytes + 1)
        produced_bytes += len(chunk)
        if produced_bytes > bytes_max:
            raise _too_large("GZIP", bytes_max)
        if not decompressor.eof:
            raise CompressionError("GZIP stream is truncated")
        chunks.append(chunk)
        assert len(decompressor.unused_data) < len(remaining)
        remaining = decompressor.unused_data
    if not chunks:
        raise CompressionError("GZIP stream is empty")
    return b"".join(chunks)


def _lz4_decompress(data: bytes | memoryview, bytes_max: int) -> bytes:
    # Output comes in chunks because the decompressor allocates `max_length` up front: one
    # call allowed `bytes_max` (64 MiB) would cost more than decoding a small batch.
    decompressor = _lz4_frame.LZ4FrameDecompressor()
    chunks: list[bytes] = []
    produced_bytes = 0
    pending: bytes | memoryview = data
    while not decompressor.eof:
        chunk_bytes_max = min(_DECOMPRESS_CHUNK_BYTES, bytes_max - produced_bytes + 1)
        chunk: bytes = decompressor.decompress(pending, max_length=chunk_bytes_max)
        pending = b""  # the decompressor keeps what it did not consume
        produced_bytes += len(chunk)
        if produced_bytes > bytes_max:
            raise _too_large("LZ4", bytes_max)
        # Out of input before the end mark, or no progress: either way the frame is cut.
        if not decompressor.eof and (decompressor.needs_input or not chunk):
            raise CompressionError("LZ4 frame is truncated (no end mark)")
        chunks.append(chunk)
    if decompressor.unused_data:
        raise CompressionError(
            f"{len(decompressor.unused_data)} bytes follow the end of the LZ4 frame"
        )
    assert produced_bytes <= bytes_max
    return b"".join(chunks)


def _zstd_decompress(data: bytes | memoryview, bytes_max: int) -> bytes:
    if len(data) == 0:
        raise CompressionError("ZSTD stream is empty")
    # Two passes. The first only measures, with bounded reads: a frame need not record its
    # content size (the JVM client's streaming encoder leaves it out), so this is the one
    # way to refuse a bomb before allocating it. The second decompresses frame by frame
    # with an object that reports truncation (`eof`) and trailing bytes, which the bounded
    # reader silently ignores; it is safe now that the total is known to be within bounds.
    _zstd_check_size(data, bytes_max)
    chunks: list[bytes] = []
    remaining = bytes(data)
    while remaining:
        decompressor = _zstd.ZstdDecompressor().decompressobj()
        chunks.append(decompressor.decompress(remaining))
        if not decompressor.eof:
            raise CompressionError("ZSTD frame is truncated")
        assert len(decompressor.unused_data) < len(remaining)
        remaining = decompressor.unused_data
    return b"".join(chunks)


def _zstd_check_size(data: bytes | memoryview, bytes_max: int) -> None:
    produced_bytes = 0
    reader = _zstd.ZstdDecompressor().stream_reader(data, read_across_frames=True)
    with reader:
        while produced_bytes <= bytes_max:
            chunk = reader.read(min(_DECOMPRESS_CHUNK_BYTES, bytes_max - produced_bytes + 1))
            if not chunk:
                return
            produced_bytes += len(chunk)
    raise _too_large("ZSTD", bytes_max)
