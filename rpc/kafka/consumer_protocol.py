"""The subscribed topics in a classic group member's JoinGroup metadata (Kafka's
ConsumerProtocolSubscription), read as Kafka's coordinator reads them.

A member of a group whose protocol type is "consumer" sends, for each assignor it supports,
metadata that starts with an int16 version and then, in every version, the subscription's
topics (an int32 count, then each an int16 length and UTF-8 bytes); later versions only
append fields. Kafka's ClassicGroup parses the version-0 prefix and ignores the rest, so a
client of any version is understood; metadata that does not parse means the topics are unknown.
"""

from __future__ import annotations

import struct

__all__ = ["subscribed_topics"]

_TOPICS_MAX = 10_000  # a count above this is not a subscription (Kafka bounds none; we do)


def subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics `metadata` subscribes to; None when it is not a consumer subscription."""
    try:
        version, count = struct.unpack_from(">hi", metadata, 0)
        position = 6
        if version < 0 or not 0 <= count <= _TOPICS_MAX:
            return None
        topics = []
        for _ in range(count):
            (length,) = struct.unpack_from(">h", metadata, position)
            position += 2
            raw = metadata[position : position + length]
            if length < 0 or len(raw) != length:
                return None
            topics.append(raw.decode("utf-8"))
            position += length
    except (struct.error, UnicodeDecodeError):
        return None
    return frozenset(topics)
