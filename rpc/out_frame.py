"""A frame on its way to a peer (raftlog.rpc.peer_transport): consecutive buffers, handed to
the socket in slices, and the frame sizes the transport budgets with."""

from __future__ import annotations

from collections.abc import Sequence

from raftlog.rpc.codec import FRAME_HEADER, Buffer, encode_messages

__all__ = ["FRAME_OVERHEAD_BYTES", "HEARTBEAT_FRAME", "WRITE_SLICE_BYTES", "OutFrame"]

# A MESSAGES frame with no items: the node-pair heartbeat.
HEARTBEAT_FRAME = bytes(encode_messages([]))
# Bytes of a MESSAGES frame around its items: the frame header and the item count.
FRAME_OVERHEAD_BYTES = FRAME_HEADER.size + 4
# Frames are handed to the socket at most this much at a time (see PeerTransport._pump).
WRITE_SLICE_BYTES = 256 * 1024


class OutFrame:
    """A frame to send, as consecutive buffers (`codec.encode_message_parts`: large entry
    data is the entries' own bytes, never copied into a frame)."""

    __slots__ = ("parts", "size_bytes")

    def __init__(self, parts: Sequence[Buffer]) -> None:
        self.parts = tuple(parts)
        self.size_bytes = sum(len(part) for part in self.parts)

    def __len__(self) -> int:
        return self.size_bytes

    def chunk(self, start: int, bytes_max: int) -> Buffer:
        """Up to `bytes_max` bytes from `start`, from one part (without copying)."""
        assert 0 <= start < self.size_bytes and bytes_max > 0, (start, self.size_bytes)
        for part in self.parts:
            if start < len(part):
                if start == 0 and len(part) <= bytes_max:
                    return part
                return memoryview(part)[start : start + bytes_max]
            start -= len(part)
        raise AssertionError("start lies inside the frame")
