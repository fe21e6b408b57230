"""The idempotent producers' table (KIP-98): the verdict on each batch's sequence numbers."""

from __future__ import annotations

from raftlog.partition.producer_state import ProducerStateTable, Verdict


def _table_with(
    producer_id: int, epoch: int, sequences: list[tuple[int, int]]
) -> ProducerStateTable:
    table = ProducerStateTable(producers_max=10)
    offset = 0
    for first, count in sequences:
        table.record(
            producer_id=producer_id,
            epoch=epoch,
            base_sequence=first,
            record_count=count,
            base_offset=offset,
            last_offset=offset + count - 1,
        )
        offset += count
    return table


def _verdict(table: ProducerStateTable, epoch: int, first: int, count: int = 1) -> Verdict:
    return table.check(producer_id=7, epoch=epoch, base_sequence=first, record_count=count).verdict


def test_a_producer_the_table_does_not_know_may_continue_any_sequence() -> None:
    # Its topic was recreated, or its state expired: Kafka accepts (librdkafka test 0107).
    empty = ProducerStateTable(producers_max=10)
    assert _verdict(empty, 0, 0) is Verdict.NEW
    assert _verdict(empty, 3, 41) is Verdict.NEW


def test_a_known_producer_continues_its_sequence_or_is_refused() -> None:
    table = _table_with(7, 0, [(0, 2), (2, 3)])
    assert _verdict(table, 0, 5) is Verdict.NEW
    assert _verdict(table, 0, 2, 3) is Verdict.DUPLICATE
    assert _verdict(table, 0, 6) is Verdict.OUT_OF_ORDER  # a gap: 5 was never written


def test_a_new_epoch_starts_again_at_zero_and_an_old_one_is_fenced() -> None:
    table = _table_with(7, 2, [(0, 2)])
    assert _verdict(table, 3, 0) is Verdict.NEW
    assert _verdict(table, 3, 2) is Verdict.OUT_OF_ORDER
    assert _verdict(table, 1, 2) is Verdict.FENCED
