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


def _txn_batch(table: ProducerStateTable, first: int, count: int, offset: int) -> None:
    table.record(
        producer_id=7,
        epoch=0,
        base_sequence=first,
        record_count=count,
        base_offset=offset,
        last_offset=offset + count - 1,
        transactional=True,
    )


def _txn_verdict(table: ProducerStateTable, first: int, count: int = 1) -> Verdict:
    return table.check(
        producer_id=7, epoch=0, base_sequence=first, record_count=count, transactional=True
    ).verdict


def test_a_retry_inside_the_open_transaction_is_a_duplicate() -> None:
    table = ProducerStateTable(producers_max=10)
    _txn_batch(table, 0, 2, offset=10)
    _txn_batch(table, 2, 1, offset=12)
    assert _txn_verdict(table, 2) is Verdict.DUPLICATE
    assert _txn_verdict(table, 0, 2) is Verdict.DUPLICATE


def test_the_sequences_of_an_ended_transactions_batch_are_a_new_batch_refused() -> None:
    # librdkafka's abort_transaction purges a batch it queued for a retry although a leader
    # had written it, then numbers the next transaction's batch from the same sequence: as
    # a duplicate it would be acknowledged at the aborted batch's offset and never written.
    table = ProducerStateTable(producers_max=10)
    _txn_batch(table, 0, 1, offset=10)
    _txn_batch(table, 1, 1, offset=11)
    table.end_transaction(producer_id=7, epoch=0, coordinator_epoch=1, commit=False, offset=12)
    refused = table.check(
        producer_id=7, epoch=0, base_sequence=1, record_count=1, transactional=True
    )
    assert refused.verdict is Verdict.OUT_OF_ORDER
    assert "after the transaction of its batch at offset 11 ended" in refused.message
    # Once the next transaction is open, a batch of the earlier one is still not a retry.
    _txn_batch(table, 2, 1, offset=13)
    assert _txn_verdict(table, 1) is Verdict.OUT_OF_ORDER
    assert _txn_verdict(table, 2) is Verdict.DUPLICATE
    # An idempotent (non-transactional) producer's retries are unchanged.
    assert _verdict(_table_with(7, 0, [(0, 1)]), 0, 0) is Verdict.DUPLICATE
