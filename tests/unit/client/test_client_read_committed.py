"""A read_committed consumer's filter over one fetch answer (raftlog.client._fetcher.
AbortedFilter): control batches and the batches of aborted transactions are skipped, told
apart by batch attributes and the answer's aborted transactions, as Kafka's consumer does."""

from __future__ import annotations

from raftlog.client._fetcher import AbortedFilter
from raftlog.storage.batch import parse_header
from raftlog.storage.records import RecordInput, encode_batch, encode_txn_marker


def _data(pid: int, offset: int, *, transactional: bool = True):  # type: ignore[no-untyped-def]
    batch = encode_batch(
        [RecordInput(None, b"v", 0)],
        base_offset=offset,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=offset,
        is_transactional=transactional,
    )
    return parse_header(batch)


def _marker(pid: int, offset: int, *, commit: bool):  # type: ignore[no-untyped-def]
    batch = bytearray(
        encode_txn_marker(
            commit=commit, producer_id=pid, producer_epoch=0, coordinator_epoch=0, timestamp_ms=0
        )
    )
    batch[0:8] = offset.to_bytes(8, "big")  # the base offset lies outside the CRC
    return parse_header(bytes(batch))


def test_aborted_runs_are_skipped_until_their_marker() -> None:
    # Producer 7 aborts [0, 3), producer 8 commits [1, 5), producer 7 again commits [4, 7).
    log = [
        _data(7, 0),
        _data(8, 1),
        _data(7, 2),
        _marker(7, 3, commit=False),
        _data(7, 4),
        _marker(8, 5, commit=True),
        _data(9, 6, transactional=False),
        _marker(7, 7, commit=True),
    ]
    aborted = AbortedFilter([(7, 0)])
    kept = [h.base_offset for h in log if not aborted.skips(h)]
    assert kept == [1, 4, 6]
    nothing_aborted = AbortedFilter([])
    assert [h.base_offset for h in log if not nothing_aborted.skips(h)] == [0, 1, 2, 4, 6]
    # An answer that starts inside the aborted run (a fetch from offset 2) lists it too.
    late = AbortedFilter([(7, 0)])
    assert [h.base_offset for h in log[2:] if not late.skips(h)] == [4, 6]
