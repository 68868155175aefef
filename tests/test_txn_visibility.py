"""What a segment's readers see of transactions (``runtime.txn_visibility``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.errors import TransactionNotOpenError
from runtime.txn_visibility import Fate, TxnIndex


def test_readers_stop_at_the_first_batch_of_an_undecided_transaction() -> None:
    index = TxnIndex()
    index.batch(0, None)
    index.batch(10, "t1")
    index.batch(20, None)
    index.batch(30, "t2")
    assert index.stable_end(40) == 10 and index.open == {"t1": 10, "t2": 30}
    index.marker(40, "t2", committed=True)  # a younger decision does not move it
    assert index.stable_end(40) == 10
    index.marker(40, "t1", committed=False)
    assert index.stable_end(40) == 40
    assert [index.visible(t) for t in (None, "t1", "t2")] == [True, False, True]
    assert index.fate("t1") == Fate(10, 40, committed=False)


def test_a_batch_of_a_decided_transaction_is_refused() -> None:
    index = TxnIndex()
    index.marker(0, "t1", committed=False)  # joined, but no message came before the abort
    with pytest.raises(TransactionNotOpenError, match="aborted in this segment"):
        index.check("t1")
    assert index.stable_end(0) == 0 and index.fate("t1") == Fate(None, 0, committed=False)


def test_a_marker_again_changes_nothing_and_a_contradicting_one_is_refused() -> None:
    index = TxnIndex()
    index.batch(0, "t1")
    index.marker(5, "t1", committed=True)
    index.marker(9, "t1", committed=True)
    assert index.fate("t1") == Fate(0, 5, committed=True)
    with pytest.raises(TransactionNotOpenError, match="already committed"):
        index.marker(9, "t1", committed=False)


# Each step: a batch of no transaction (None), a batch of transaction i, or its marker.
STEPS = st.lists(
    st.one_of(
        st.none(),
        st.tuples(st.just("batch"), st.integers(0, 4)),
        st.tuples(st.just("marker"), st.integers(0, 4), st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(STEPS)
def test_readers_see_exactly_the_committed_part_in_log_order(steps: list) -> None:
    """Whatever the interleaving: what is read below the stable end is every batch of
    no transaction and of committed ones, in log order, never one of an undecided or
    aborted transaction; the stable end never moves back; and it never passes a
    batch whose fate is unknown."""
    index, log, fates, stable = TxnIndex(), [], {}, 0
    for step in steps:
        end = len(log)
        if step is None:
            index.batch(end, None)
            log.append(None)
        elif step[0] == "batch":
            txn = f"t{step[1]}"
            if txn in fates:
                with pytest.raises(TransactionNotOpenError):
                    index.check(txn)
                continue
            index.check(txn)
            index.batch(end, txn)
            log.append(txn)
        else:
            txn, committed = f"t{step[1]}", step[2]
            fates.setdefault(txn, committed)
            if fates[txn] != committed:
                with pytest.raises(TransactionNotOpenError):
                    index.marker(end, txn, committed)
                continue
            index.marker(end, txn, committed)
        now = index.stable_end(len(log))
        assert now >= stable
        stable = now
        assert all(txn is None or txn in fates for txn in log[:stable])
        read = [i for i, txn in enumerate(log[:stable]) if index.visible(txn)]
        assert read == [i for i, txn in enumerate(log[:stable]) if txn is None or fates[txn]]
