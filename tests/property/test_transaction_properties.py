"""The transaction coordinator's state machine against a plain model (Hypothesis stateful).

Clients race the coordinator with InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit and EndTxn (v4 and v5) from the current producer, a fenced older one and a
producer from the future; the coordinator's own plans (`plan_init`, `plan_end_txn`) are used
where the wire handler uses them, the marker duty completes preparing transactions, and
snapshots are restored mid-run. After every step: the state's invariants, the model's state,
epoch and partitions of every id, `partition_in_transaction` exactly for the model's open
transactions, and committed offsets exactly those of committed transactions."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from raftlog.metadata.commands import (
    AddToTransaction,
    AllocateProducerIds,
    ApplyResult,
    Command,
    CommitTransactionOffsets,
    CompleteEndTransaction,
    CreateTopic,
    ErrorCode,
    RegisterNode,
    encode_command,
)
from raftlog.metadata.state import MetadataState
from raftlog.metadata.transaction_plans import Answer, plan_end_txn, plan_init
from raftlog.metadata.transactions import TxnState, partition_in_transaction
from raftlog.types import NodeId, PartitionId, RaftGroupId

IDS = ("a", "b")
PARTITIONS = tuple(("t", p) for p in range(3))


class Model:
    """One transactional id as a client would reason about it."""

    def __init__(self, producer_id: int) -> None:
        self.producer_id = producer_id
        self.epoch = 0
        self.state = TxnState.EMPTY
        self.partitions: set[tuple[str, int]] = set()
        self.pending: dict[tuple[str, int], int] = {}
        self.group_added = False


class TransactionsAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = MetadataState("model")
        self.models: dict[str, Model] = {}
        self.committed: dict[tuple[str, int], int] = {}
        self.next_offset = 0
        self.now_ms = 0

    def _apply(self, command: Command) -> ApplyResult:
        self.now_ms += 1
        return self.state.apply(self.state.applied_offset + 1, encode_command(command))

    @initialize()
    def setup(self) -> None:
        for node in (1, 2, 3):
            assert self._apply(RegisterNode(NodeId(node), f"n{node}:1", f"n{node}:2", 0, 0)).ok
        topic = CreateTopic(
            "t",
            "id-t",
            3,
            1,
            {},
            ((NodeId(1),), (NodeId(2),), (NodeId(3),)),
            (RaftGroupId(1), RaftGroupId(2), RaftGroupId(3)),
        )
        assert self._apply(topic).ok
        assert self._apply(AllocateProducerIds(1000)).ok

    @rule(transactional_id=st.sampled_from(IDS))
    def init_producer_id(self, transactional_id: str) -> None:
        model = self.models.get(transactional_id)
        fresh = len(self.models) + 10  # unique per id: ids never share a producer id
        plan = plan_init(self.state, transactional_id, 60_000, None, fresh, self.now_ms)
        if model is None:
            assert not isinstance(plan, Answer)
            assert self._apply(plan.command).ok
            self.models[transactional_id] = Model(fresh)
            return
        if model.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            assert isinstance(plan, Answer) and plan.code is ErrorCode.CONCURRENT_TRANSACTIONS
            return
        assert not isinstance(plan, Answer)
        assert self._apply(plan.command).ok
        model.epoch += 1
        if model.state is TxnState.ONGOING:  # fenced: aborted at the bumped epoch first
            assert plan.then is ErrorCode.CONCURRENT_TRANSACTIONS
            model.state = TxnState.PREPARE_ABORT
        else:
            model.state = TxnState.EMPTY

    @rule(
        transactional_id=st.sampled_from(IDS),
        epoch_offset=st.sampled_from((0, 0, 0, -1, 1)),
        partitions=st.sets(st.sampled_from(PARTITIONS), min_size=1, max_size=2),
        group=st.booleans(),
    )
    def add(
        self,
        transactional_id: str,
        epoch_offset: int,
        partitions: set[tuple[str, int]],
        group: bool,
    ) -> None:
        model = self.models.get(transactional_id)
        if model is None or model.epoch + epoch_offset < 0:
            return
        command = AddToTransaction(
            transactional_id,
            model.producer_id,
            model.epoch + epoch_offset,
            tuple((t, PartitionId(p)) for t, p in sorted(partitions)),
            ("g",) if group else (),
            self.now_ms,
        )
        result = self._apply(command)
        expected = (
            ErrorCode.PRODUCER_FENCED
            if epoch_offset < 0
            else ErrorCode.INVALID_PRODUCER_EPOCH
            if epoch_offset > 0
            else ErrorCode.CONCURRENT_TRANSACTIONS
            if model.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
            else ErrorCode.NONE
        )
        assert result.code is expected, (result, model.state)
        if result.ok:
            model.state = TxnState.ONGOING
            model.partitions |= partitions
            model.group_added |= group

    @rule(transactional_id=st.sampled_from(IDS), partition=st.integers(0, 2))
    def txn_offset_commit(self, transactional_id: str, partition: int) -> None:
        model = self.models.get(transactional_id)
        if model is None:
            return
        self.next_offset += 1
        offsets = (("t", PartitionId(partition), self.next_offset),)
        command = CommitTransactionOffsets(
            transactional_id, model.producer_id, model.epoch, "g", offsets
        )
        result = self._apply(command)
        assert result.ok == (model.state is TxnState.ONGOING and model.group_added), result
        if result.ok:
            model.pending[("t", partition)] = self.next_offset

    @rule(
        transactional_id=st.sampled_from(IDS),
        commit=st.booleans(),
        bump=st.booleans(),
        late=st.booleans(),
    )
    def end_txn(self, transactional_id: str, commit: bool, bump: bool, late: bool) -> None:
        model = self.models.get(transactional_id)
        if model is None or (late and model.epoch == 0):
            return
        epoch = model.epoch - 1 if late else model.epoch
        plan = plan_end_txn(
            self.state, transactional_id, model.producer_id, epoch, commit, bump, self.now_ms
        )
        if isinstance(plan, Answer):
            assert late or model.state is not TxnState.ONGOING, plan
            return
        result = self._apply(plan.command)
        assert result.ok == (not late and model.state is TxnState.ONGOING), (result, model.state)
        if result.ok:
            model.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            model.epoch += 1 if bump else 0

    @rule(transactional_id=st.sampled_from(IDS))
    def markers_written(self, transactional_id: str) -> None:
        model = self.models.get(transactional_id)
        if model is None:
            return
        command = CompleteEndTransaction(
            transactional_id, model.producer_id, model.epoch, self.now_ms
        )
        result = self._apply(command)
        preparing = model.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
        assert result.ok == preparing, result
        if not result.ok:
            return
        if model.state is TxnState.PREPARE_COMMIT:
            self.committed.update(model.pending)
            model.state = TxnState.COMPLETE_COMMIT
        else:
            model.state = TxnState.COMPLETE_ABORT
        model.pending, model.partitions, model.group_added = {}, set(), False

    @rule()
    def restore_snapshot(self) -> None:
        restored = MetadataState.restore(self.state.snapshot())
        assert restored.snapshot() == self.state.snapshot()
        self.state = restored

    @invariant()
    def matches_the_model(self) -> None:
        self.state.check_invariants()
        for transactional_id, model in self.models.items():
            txn = self.state.transaction(transactional_id)
            assert txn is not None
            assert (txn.producer_id, txn.producer_epoch, txn.state) == (
                model.producer_id,
                model.epoch,
                model.state,
            )
            assert txn.partitions == model.partitions
            for topic, partition in PARTITIONS:
                for epoch in (model.epoch - 1, model.epoch):
                    expected = (
                        model.state is TxnState.ONGOING
                        and epoch == model.epoch
                        and (topic, partition) in model.partitions
                    )
                    found = partition_in_transaction(
                        self.state, model.producer_id, epoch, topic, partition
                    )
                    assert found == expected
        assert self.state.committed_offsets("g") == self.committed


TransactionsAgainstModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_transactions_against_model = TransactionsAgainstModel.TestCase
