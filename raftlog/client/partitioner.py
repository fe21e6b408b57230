"""Choosing a record's partition, exactly as Kafka's Java client does.

Theory of operation. A record with a key goes to `(murmur2(key) & 0x7fffffff) % partitions`
(Java's `Utils.toPositive(Utils.murmur2(key)) % numPartitions`), so the same key lands on the
same partition as with any Kafka client. A record without a key follows the *sticky*
partitioner (KIP-480): every keyless record goes to one partition until a batch for that
partition is closed, then a new partition is drawn at random. That fills batches instead of
spreading single records over all partitions.

`murmur2` returns the unsigned 32-bit value (kafka-python's convention); Java's signed int has
the same bits, and the 0x7fffffff mask makes both give the same partition.
"""

from __future__ import annotations

import random
import threading

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK_32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 of `data` with Kafka's seed, as `org.apache.kafka.common.utils.Utils`."""
    length = len(data)
    h = (_SEED ^ length) & _MASK_32
    whole_words = length // 4
    for i in range(whole_words):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * _M) & _MASK_32
        k ^= k >> _R
        k = (k * _M) & _MASK_32
        h = ((h * _M) & _MASK_32) ^ k
    tail = data[4 * whole_words :]
    # Java's switch falls through from 3 to 1: each byte of the tail is mixed in.
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if len(tail) >= 1:
        h ^= tail[0]
        h = (h * _M) & _MASK_32
    h ^= h >> 13
    h = (h * _M) & _MASK_32
    h ^= h >> 15
    assert 0 <= h <= _MASK_32
    return h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for `key` among `partitions`."""
    assert partitions > 0, partitions
    partition = (murmur2(key) & 0x7FFFFFFF) % partitions
    assert 0 <= partition < partitions
    return partition


class StickyPartitioner:
    """Keyless records stick to one partition per topic until its batch closes (KIP-480).

    Randomness comes in through `rng` so tests are deterministic. Thread-safe: send() runs on
    the caller's threads while the sender thread reports closed batches.
    """

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._sticky: dict[str, int] = {}
        self._lock = threading.Lock()

    def partition(self, topic: str, partitions: int) -> int:
        """The current sticky partition of `topic` (drawing one if there is none)."""
        assert partitions > 0, partitions
        # Read without the lock first (a dict read is atomic under the GIL): send() asks on
        # every keyless record and the answer changes only when a batch closes.
        current = self._sticky.get(topic)
        if current is not None and current < partitions:
            return current
        with self._lock:
            current = self._sticky.get(topic)
            if current is None or current >= partitions:
                current = self._rng.randrange(partitions)
                self._sticky[topic] = current
        assert 0 <= current < partitions
        return current

    def on_batch_closed(self, topic: str, partition: int, partitions: int) -> None:
        """A batch of `topic`/`partition` closed: if it was sticky, draw another partition."""
        assert partitions > 0, partitions
        with self._lock:
            if self._sticky.get(topic) != partition:
                return
            if partitions == 1:
                return
            # A different partition than the one just filled, as the Java client does.
            choice = self._rng.randrange(partitions - 1)
            self._sticky[topic] = choice if choice < partition else choice + 1
