"""The producer table's transactions against a plain model (Hypothesis): for any interleaving
of transactional batches, plain batches and COMMIT/ABORT markers of a few producers, the
LSO's bound is the first offset of the earliest open transaction, the markers return
exactly the aborted non-empty transactions (what the replica appends to the aborted-
transaction index: tests/property/test_txn_index_files.py), and the open transactions
survive encode/decode (checkpoints and snapshots), with the aborted transactions carried
beside the table."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.partition.producer_state import AbortedTxn, ProducerStateTable, decode_aborted

PRODUCERS = (1, 2, 3)


@dataclass
class Model:
    open: dict[int, int] = field(default_factory=dict)  # producer id -> first offset
    aborted: list[tuple[int, int, int]] = field(default_factory=list)


# An operation: (kind, producer id, record count); kind "txn", "plain", "commit" or "abort".
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["txn", "txn", "plain", "commit", "abort"]),
        st.sampled_from(PRODUCERS),
        st.integers(1, 3),
    ),
    max_size=40,
)


def _run(
    ops: list[tuple[str, int, int]],
) -> tuple[ProducerStateTable, Model, int, list[AbortedTxn]]:
    table = ProducerStateTable(producers_max=10)
    returned: list[AbortedTxn] = []
    model = Model()
    sequences = dict.fromkeys(PRODUCERS, 0)
    offset = 0
    for kind, producer_id, count in ops:
        if kind in ("txn", "plain"):
            transactional = kind == "txn"
            if not transactional and producer_id in model.open:
                continue  # refused INVALID_TXN_STATE: nothing is written
            table.record(
                producer_id=producer_id,
                epoch=0,
                base_sequence=sequences[producer_id],
                record_count=count,
                base_offset=offset,
                last_offset=offset + count - 1,
                transactional=transactional,
            )
            sequences[producer_id] += count
            if transactional:
                model.open.setdefault(producer_id, offset)
            offset += count
        else:
            aborted = table.end_transaction(
                producer_id=producer_id,
                epoch=0,
                coordinator_epoch=0,
                commit=kind == "commit",
                offset=offset,
            )
            if aborted is not None:
                returned.append(aborted)
            first = model.open.pop(producer_id, None)
            if first is not None and kind == "abort":
                model.aborted.append((producer_id, first, offset))
            offset += 1
    return table, model, offset, returned


def _triples(aborted: list[AbortedTxn]) -> list[tuple[int, int, int]]:
    return [(a.producer_id, a.first_offset, a.last_offset) for a in aborted]


@settings(max_examples=100, deadline=None)
@given(ops=_OPS, data=st.data())
def test_the_table_matches_the_model(ops: list[tuple[str, int, int]], data: st.DataObject) -> None:
    table, model, end, returned = _run(ops)
    assert table.first_open_offset() == (min(model.open.values()) if model.open else None)
    assert table.open_transactions() == model.open
    assert _triples(returned) == model.aborted
    for producer_id in PRODUCERS:
        assert table.has_open_transaction(producer_id) == (producer_id in model.open)
    start = data.draw(st.integers(0, end))
    carried = [a for a in returned if a.last_offset >= start]
    encoded = table.encode(aborted=carried)
    decoded = ProducerStateTable.decode(encoded, producers_max=10)
    assert decoded.open_transactions() == model.open
    assert decode_aborted(encoded) == carried
    assert decode_aborted(table.encode()) == []


@settings(max_examples=30, deadline=None)
@given(ops=_OPS)
def test_replaying_a_suffix_after_a_newer_table_converges(ops: list[tuple[str, int, int]]) -> None:
    """A snapshot's table may be ahead of its offset: re-applying the entries after that
    offset must end where applying them once does (the replica's compaction_snapshot)."""
    table, model, _, _ = _run(ops)
    cut = len(ops) // 2
    returned: list[AbortedTxn] = []
    replayed = ProducerStateTable.decode(table.encode(), producers_max=10)
    offset = 0
    sequences = dict.fromkeys(PRODUCERS, 0)
    open_now: set[int] = set()
    for index, (kind, producer_id, count) in enumerate(ops):
        replay = index >= cut
        if kind in ("txn", "plain"):
            if kind == "plain" and producer_id in open_now:
                continue
            if replay:
                replayed.record(
                    producer_id=producer_id,
                    epoch=0,
                    base_sequence=sequences[producer_id],
                    record_count=count,
                    base_offset=offset,
                    last_offset=offset + count - 1,
                    transactional=kind == "txn",
                )
            if kind == "txn":
                open_now.add(producer_id)
            sequences[producer_id] += count
            offset += count
        else:
            if replay:
                aborted = replayed.end_transaction(
                    producer_id=producer_id,
                    epoch=0,
                    coordinator_epoch=0,
                    commit=kind == "commit",
                    offset=offset,
                )
                if aborted is not None:
                    returned.append(aborted)
            open_now.discard(producer_id)
            offset += 1
    assert replayed.open_transactions() == model.open
    # The newer table has ended the transactions the replayed markers end: a replayed ABORT
    # returns an aborted transaction only when a replayed batch reopened it, and then with
    # that batch's offset, not the transaction's first. So a snapshot carries the aborted
    # transactions after its offset beside its table, and the replica indexes those first
    # (partition/replica.py, compaction_snapshot and apply).
    true_first = {(p, last): first for p, first, last in model.aborted}
    for txn in returned:
        assert txn.first_offset >= true_first[(txn.producer_id, txn.last_offset)]
