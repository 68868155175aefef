"""A transaction's record: its rules (``runtime.transactions``) and its swaps in the
metadata store (``storage.transactions``, on an in-memory KV)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.errors import (
    ConflictError,
    InvalidArgumentError,
    InvalidNameError,
    TransactionNotFoundError,
    TransactionNotOpenError,
    UnauthorizedError,
)
from runtime.transactions import (
    FENCED,
    FINISHED_KEPT_MS,
    TIMED_OUT,
    Abort,
    Acknowledge,
    Commit,
    Expire,
    Finish,
    Join,
    PendingAck,
    SegmentRef,
    TxnRecord,
    TxnStatus,
    ack_calls,
    begin,
    check_holder,
    forgettable,
    needs_sweep,
)
from storage.metadata import MemoryKeyValue, MetadataStore
from storage.transactions import Transactions

T0 = 1_000_000
SEGMENTS = ("segment://t/ns/orders/0000-7fff-0", "segment://t/ns/orders/8000-ffff-1")
S0, S1 = SegmentRef(SEGMENTS[0]), SegmentRef(SEGMENTS[1])
ACK = PendingAck(SEGMENTS[0], "billing", 41)


def opened(timeout_s: float = 10) -> TxnRecord:
    return begin("txn-a", T0, timeout_s)


# --- the rules -----------------------------------------------------------------------


def test_an_open_transaction_takes_segments_and_acknowledgements_then_commits() -> None:
    record = Join(frozenset({S0})).apply(opened(), T0 + 1)
    record = Join(frozenset({S0, S1})).apply(record, T0 + 2)
    record = Acknowledge((ACK,)).apply(record, T0 + 3)
    assert record.segments == {S0, S1} and record.acks == (ACK,)
    committing = Commit().apply(record, T0 + 4)
    assert committing.status is TxnStatus.COMMITTING and committing.decided_ms == T0 + 4
    assert Finish().apply(committing, T0 + 5).status is TxnStatus.COMMITTED


def test_updates_asked_again_change_nothing() -> None:
    record = Acknowledge((ACK,)).apply(Join(frozenset({S0})).apply(opened(), T0), T0)
    assert Join(frozenset({S0})).apply(record, T0) is record
    assert Acknowledge((ACK,)).apply(record, T0) is record
    committing = Commit().apply(record, T0)
    assert Commit().apply(committing, T0 + 1) is committing  # a retry after a lost answer
    committed = Finish().apply(committing, T0)
    assert Finish().apply(committed, T0) is committed and Commit().apply(committed, T0) is committed


def test_a_decided_transaction_takes_nothing_more() -> None:
    for decided in (Commit().apply(opened(), T0), Abort().apply(opened(), T0)):
        with pytest.raises(TransactionNotOpenError, match=decided.status.value):
            Join(frozenset({S1})).apply(decided, T0)
        with pytest.raises(TransactionNotOpenError):
            Acknowledge((ACK,)).apply(decided, T0)


def test_a_commit_and_an_abort_exclude_each_other() -> None:
    aborting = Abort().apply(opened(), T0)
    with pytest.raises(TransactionNotOpenError, match="aborting"):
        Commit().apply(aborting, T0)
    with pytest.raises(TransactionNotOpenError, match="aborted"):
        Commit().apply(Finish().apply(aborting, T0), T0)
    committing = Commit().apply(opened(), T0)
    with pytest.raises(TransactionNotOpenError, match="committing: it cannot abort"):
        Abort().apply(committing, T0)


def test_a_transaction_past_its_deadline_only_aborts() -> None:
    record = Join(frozenset({S0})).apply(opened(timeout_s=2), T0)
    late = T0 + 2_000
    with pytest.raises(TransactionNotOpenError, match="timed out"):
        Commit().apply(record, late)
    with pytest.raises(TransactionNotOpenError, match="timed out"):
        Join(frozenset({S1})).apply(record, late)
    assert Expire().apply(record, late - 1) is record
    expired = Expire().apply(record, late)
    assert (expired.status, expired.reason, expired.segments) == (
        TxnStatus.ABORTING, TIMED_OUT, {S0}
    )  # fmt: skip
    assert Abort().apply(expired, late) is expired


def test_a_fence_aborts_an_open_transaction_but_not_a_decided_commit() -> None:
    fenced = Abort(FENCED).apply(opened(), T0)
    assert (fenced.status, fenced.reason) == (TxnStatus.ABORTING, FENCED)
    committing = Commit().apply(opened(), T0)
    assert Abort(FENCED).apply(committing, T0) is committing  # its decision stands


def test_only_a_decided_transaction_finishes() -> None:
    with pytest.raises(TransactionNotOpenError, match="open"):
        Finish().apply(opened(), T0)
    assert Finish().apply(Abort().apply(opened(), T0), T0).status is TxnStatus.ABORTED


def test_time_outs_out_of_bounds_are_refused() -> None:
    for timeout_s in (0, 0.5, 901, -1):
        with pytest.raises(InvalidArgumentError, match="timeout_s"):
            begin("txn-a", T0, timeout_s)


def test_the_sweeper_takes_expired_and_abandoned_decisions_only() -> None:
    record = opened(timeout_s=10)
    assert not needs_sweep(record, T0 + 9_999) and needs_sweep(record, T0 + 10_000)
    committing = Commit().apply(record, T0 + 1_000)
    assert not needs_sweep(committing, T0 + 1_000 + 4_999)  # its client is finishing it
    assert needs_sweep(committing, T0 + 1_000 + 5_000)
    assert not needs_sweep(Finish().apply(committing, T0), T0 + 10**9)


def test_a_finished_record_is_kept_a_while_for_retries_then_forgotten() -> None:
    committing = Commit().apply(opened(), T0 + 1_000)
    assert not forgettable(committing, T0 + 10**9)  # not finished: never
    committed = Finish().apply(committing, T0 + 2_000)
    assert not forgettable(committed, T0 + 1_000 + FINISHED_KEPT_MS - 1)
    assert forgettable(committed, T0 + 1_000 + FINISHED_KEPT_MS)


def test_a_record_reads_back_as_written() -> None:
    record = Commit().apply(
        Acknowledge((ACK, PendingAck(SEGMENTS[1], "s", 9, True))).apply(
            Join(frozenset({S0, S1})).apply(begin("txn-b", T0, 30, "app-1", 4, "orders"), T0),
            T0,
        ),
        T0,
    )
    assert TxnRecord.from_bytes(record.to_bytes()) == record

    legacy = record.to_bytes().replace(b',"principal":"orders"', b"")  # before principals
    assert TxnRecord.from_bytes(legacy).principal is None


def test_only_the_principal_that_began_a_transaction_acts_on_it() -> None:
    """Another tenant that learned a transaction's id may not commit, abort or read it;
    ``None`` (the system, an admin of every namespace, or authentication off) may, and a
    transaction begun with authentication off is anyone's."""
    theirs = begin("txn-c", T0, 30, principal="orders")
    check_holder(theirs, "orders", "commit")
    check_holder(theirs, None, "commit")
    with pytest.raises(UnauthorizedError, match="'billing' may not abort transaction txn-c"):
        check_holder(theirs, "billing", "abort")
    check_holder(begin("txn-d", T0, 30), "billing", "commit")


def test_a_commit_s_acknowledgements_are_one_call_per_segment_and_subscription() -> None:
    a, b = SEGMENTS
    acks = (
        PendingAck(a, "s", 4, True), PendingAck(a, "s", 9, True), PendingAck(a, "s", 2, True),
        PendingAck(a, "q", 7), PendingAck(a, "q", 3), PendingAck(a, "q", 7),
        PendingAck(b, "s", 5, True), PendingAck(b, "q", 1),
    )  # fmt: skip
    assert ack_calls(acks) == [
        (a, "s", True, 9), (b, "s", True, 5), (a, "q", False, [3, 7]), (b, "q", False, [1]),
    ]  # fmt: skip
    assert ack_calls(()) == []


UPDATES = st.sampled_from(
    [Join(frozenset({S0})), Acknowledge((ACK,)), Commit(), Abort(), Abort(FENCED), Expire(),
     Finish()]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(UPDATES, st.integers(0, 20_000)), max_size=12))
def test_a_decision_never_changes(steps: list) -> None:
    """Whatever is asked, in any order and at any time: once decided, the record only
    goes on to finish that decision, and a committed one never lost a message's segment
    or an acknowledgement it took."""
    record, decided = opened(timeout_s=10), None
    for update, at in steps:
        try:
            new = update.apply(record, T0 + at)
        except TransactionNotOpenError:
            continue
        if decided is not None:
            assert new.status.commits == decided and new.decided_ms == record.decided_ms
            assert new.status.finished or not record.status.finished
        elif new.status.decided:
            decided = new.status.commits
            assert new.status.commits is isinstance(update, Commit)
        assert new.segments >= record.segments and set(new.acks) >= set(record.acks)
        record = new


# --- the records in the metadata store -------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def txns(clock: Clock) -> Transactions:
    return Transactions(MetadataStore(kv=MemoryKeyValue()), clock=clock)


def test_a_transaction_is_begun_changed_and_read_back(txns: Transactions) -> None:
    record = txns.begin(timeout_s=30)
    assert record.txn_id.startswith("txn-") and record.deadline_ms == T0 + 30_000
    txns.change(record.txn_id, Join(frozenset({S0})))
    assert txns.change(record.txn_id, Commit()).status is TxnStatus.COMMITTING
    assert txns.get(record.txn_id).segments == {S0}
    assert [r.txn_id for r in txns.all()] == [record.txn_id]


def test_an_unknown_transaction_is_a_typed_error(txns: Transactions) -> None:
    with pytest.raises(TransactionNotFoundError, match="txn-nope"):
        txns.get("txn-nope")
    with pytest.raises(TransactionNotFoundError):
        txns.change("txn-nope", Commit())
    with pytest.raises(InvalidNameError):
        txns.get("../auth/policy")


def test_a_late_commit_is_refused_and_leaves_the_transaction_aborted(
    txns: Transactions, clock: Clock
) -> None:
    record = txns.begin(timeout_s=5)
    clock.now += 5_000
    with pytest.raises(TransactionNotOpenError, match="timed out"):
        txns.change(record.txn_id, Commit())
    stored = txns.get(record.txn_id)
    assert (stored.status, stored.reason) == (TxnStatus.ABORTING, TIMED_OUT)


def test_a_new_transaction_of_an_owner_fences_the_one_before(txns: Transactions) -> None:
    stale = txns.begin(owner="app-1")
    txns.change(stale.txn_id, Join(frozenset({S0})))
    fresh = txns.begin(owner="app-1")
    assert (stale.owner_epoch, fresh.owner_epoch) == (1, 2)
    with pytest.raises(TransactionNotOpenError, match="fenced"):
        txns.change(stale.txn_id, Commit())
    assert txns.get(stale.txn_id).segments == {S0}  # its markers still go there
    assert txns.change(fresh.txn_id, Commit()).status is TxnStatus.COMMITTING
    other = txns.begin(owner="app-2")  # owners are independent
    assert other.owner_epoch == 1 and txns.get(fresh.txn_id).status is TxnStatus.COMMITTING


def test_an_owner_is_its_principals_own(txns: Transactions) -> None:
    """Another principal naming the same owner fences nothing of this one's."""
    mine = txns.begin(owner="app-1", principal="orders")
    intruder = txns.begin(owner="app-1", principal="billing")
    assert (mine.owner_epoch, intruder.owner_epoch) == (1, 1)
    assert mine.principal == "orders" and intruder.principal == "billing"
    assert txns.get(mine.txn_id).status is TxnStatus.OPEN
    again = txns.begin(owner="app-1", principal="orders")
    assert again.owner_epoch == 2 and txns.get(mine.txn_id).reason == FENCED
    assert txns.begin(owner="app-1").owner_epoch == 1  # authentication off: yet another


def test_a_commit_decided_before_the_fence_stands(txns: Transactions) -> None:
    first = txns.begin(owner="app-1")
    txns.change(first.txn_id, Commit())
    _, previous = txns.begin_after(owner="app-1")  # what the coordinator finishes first
    assert previous is not None and previous.txn_id == first.txn_id
    assert previous.status is TxnStatus.COMMITTING
    assert txns.get(first.txn_id).status is TxnStatus.COMMITTING
    assert txns.begin_after(owner="app-3")[1] is None  # an owner's first has none before


def test_a_begin_overtaken_by_a_newer_one_fails_instead_of_opening(txns: Transactions) -> None:
    """The owner's record names a transaction whose record is not written yet (its
    begin is on its way): the fence writes it aborted, and the late begin fails."""
    store = txns.store
    original = store.put_if_absent
    overtaken: list[str] = []

    def put_if_absent(path: str, value: bytes):  # noqa: ANN202 - the store's own
        if path.startswith("/transactions/open/") and not overtaken:
            overtaken.append(path)
            txns.begin(owner="app-1")  # a newer begin of the same owner, right then
        return original(path, value)

    store.put_if_absent = put_if_absent  # type: ignore[method-assign]
    with pytest.raises(TransactionNotOpenError, match="fenced"):
        txns.begin(owner="app-1")
    late = txns.get(overtaken[0].rsplit("/", 1)[1])
    assert (late.status, late.reason) == (TxnStatus.ABORTED, FENCED)


def test_racing_commit_and_abort_decide_once(txns: Transactions) -> None:
    for _ in range(20):
        record = txns.begin()
        outcomes: list[str] = []

        def ask(update, record=record, outcomes=outcomes) -> None:  # noqa: ANN001
            try:
                outcomes.append(txns.change(record.txn_id, update).status.value)
            except TransactionNotOpenError:
                outcomes.append("refused")

        threads = [threading.Thread(target=ask, args=(u,)) for u in (Commit(), Abort())]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) in (["committing", "refused"], ["aborting", "refused"])
        assert txns.get(record.txn_id).status.value in outcomes


def test_only_a_finished_transaction_is_forgotten(txns: Transactions) -> None:
    record = txns.begin()
    with pytest.raises(ConflictError, match="only a finished one"):
        txns.forget(record.txn_id)
    txns.change(record.txn_id, Abort())
    txns.change(record.txn_id, Finish())
    txns.forget(record.txn_id)
    txns.forget(record.txn_id)  # gone already: nothing to do
    assert txns.all() == []


def test_the_coordinator_s_sweeper_stops_once_no_transaction_is_left() -> None:
    """No periodic reads on an idle cluster: the sweeper ends after a sweep that found no
    record, and the next transaction operation starts it again."""
    import asyncio

    from actors.admin.txn_service import TransactionOperations
    from storage.catalog import Catalog

    class Coordinator(TransactionOperations):
        def __init__(self) -> None:
            self._catalog = Catalog(store=MetadataStore(kv=MemoryKeyValue()))

    async def run() -> None:
        coordinator = Coordinator()
        coordinator._sweep_from_now_on()
        await asyncio.wait_for(asyncio.shield(coordinator._sweeper), 5)  # nothing to sweep
        Transactions(coordinator._catalog.store).begin(timeout_s=60)
        coordinator._sweep_from_now_on()
        await asyncio.sleep(2.5)  # two sweeps that found the open one
        assert not coordinator._sweeper.done()
        coordinator._sweeper.cancel()

    asyncio.run(run())
