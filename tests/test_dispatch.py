"""QueueDispatcher: exclusive hand-out, redelivery and no loss, checked against a model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.dispatch import QueueDispatcher
from runtime.errors import TransactionConflictError

TIMEOUT = 10.0
HOLD = 25.0  # a transaction's hold: longer than the ack time-out
EVERYTHING = 10**9


class Model:
    """What the dispatcher promises, kept as plain sets: who holds what until when."""

    def __init__(self, dispatcher: QueueDispatcher) -> None:
        self.dispatcher = dispatcher
        self.acked: set[int] = set()
        # offset -> (holder, until): a consumer's name, or ("txn", id) for a transaction
        self.held: dict[int, tuple[str | tuple[str, str], float]] = {}
        self.delivered: dict[int, int] = {}
        self.end = 0
        self.now = 0.0

    def take(self, consumer: str, max_records: int) -> list[int]:
        self.held = {o: h for o, h in self.held.items() if h[1] > self.now}
        taken = self.dispatcher.take(
            consumer, max_records, self.end, self.acked.__contains__, self.now
        )
        assert len(taken) == len(set(taken)) <= max_records
        for offset in taken:
            assert 0 <= offset < self.end
            assert offset not in self.acked, f"acked offset {offset} handed out again"
            assert offset not in self.held, f"offset {offset} held by {self.held[offset]}"
            self.held[offset] = (consumer, self.now + TIMEOUT)
            self.delivered[offset] = self.delivered.get(offset, 0) + 1
        return taken

    def ack(self, offsets: list[int]) -> None:
        self.acked.update(offsets)
        for offset in offsets:
            self.held.pop(offset, None)
        self.dispatcher.acknowledged(offsets)

    def nack(self, consumer: str, offsets: list[int]) -> None:
        mine = [o for o in offsets if self.held.get(o, ("", 0))[0] == consumer]
        for offset in mine:
            del self.held[offset]
        self.dispatcher.negative_ack(mine)

    def leave(self, consumer: str) -> None:
        self.held = {o: h for o, h in self.held.items() if h[0] != consumer}
        self.dispatcher.consumer_left(consumer)

    def hold(self, txn: str, offsets: list[int]) -> None:
        """A transaction holds ``offsets`` (its acknowledgement, pending): refused whole
        when another live transaction holds one of them."""
        self.held = {o: h for o, h in self.held.items() if h[1] > self.now}
        holder = ("txn", txn)
        offsets = [o for o in offsets if o not in self.acked]
        holders = {o: self.held.get(o, (holder, 0))[0] for o in offsets}
        others = [o for o, h in holders.items() if isinstance(h, tuple) and h != holder]
        try:
            self.dispatcher.hold(offsets, txn, self.acked.__contains__, self.now, HOLD)
        except TransactionConflictError:
            assert others, "a hold refused with no other transaction holding"
            return
        assert not others, f"{others} held by another transaction, held again"
        for offset in offsets:
            self.held[offset] = (holder, self.now + HOLD)

    def release(self, txn: str) -> None:
        self.held = {o: h for o, h in self.held.items() if h[0] != ("txn", txn)}
        self.dispatcher.release(txn)

    def available(self) -> set[int]:
        """Offsets a take with no limit must return now: unacked and not validly held."""
        live = {o for o, h in self.held.items() if h[1] > self.now}
        return set(range(self.end)) - self.acked - live


def test_take_hands_out_new_offsets_in_order_and_exclusively() -> None:
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    never = set().__contains__
    assert dispatcher.take("a", 3, 10, never, 0.0) == [0, 1, 2]
    assert dispatcher.take("b", 3, 10, never, 0.0) == [3, 4, 5]
    assert dispatcher.take("a", 100, 10, never, 0.0) == [6, 7, 8, 9]
    assert dispatcher.take("c", 100, 10, never, 0.0) == []
    assert dispatcher.in_flight == 10


def test_negative_ack_redelivers_lowest_first_to_anyone() -> None:
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    never = set().__contains__
    dispatcher.take("a", 5, 5, never, 0.0)
    dispatcher.negative_ack([3, 1])
    assert dispatcher.pending_redelivery == 2
    assert dispatcher.in_flight == 3
    assert dispatcher.take("b", 1, 5, never, 1.0) == [1]
    assert dispatcher.take("c", 10, 5, never, 1.0) == [3]
    dispatcher.negative_ack([42])  # never handed out: nothing to redeliver
    assert dispatcher.pending_redelivery == 0


def test_a_delayed_negative_ack_comes_back_only_when_due_and_counts_deliveries() -> None:
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    never = set().__contains__
    assert dispatcher.take("a", 3, 3, never, 0.0) == [0, 1, 2]
    assert dispatcher.redeliveries([0, 1, 2]) == [0, 0, 0]
    dispatcher.negative_ack([1], "a", delay_s=2.0, now=1.0)
    dispatcher.negative_ack([2], "a")  # at once
    assert dispatcher.due_in(1.5) == 1.5
    assert dispatcher.take("b", 10, 3, never, 2.9) == [2]
    assert dispatcher.take("b", 10, 3, never, 3.0) == [1]
    assert dispatcher.due_in(3.0) is None
    assert dispatcher.redeliveries([0, 1, 2]) == [0, 1, 1]
    dispatcher.negative_ack([1], "b", delay_s=1.0, now=3.0)
    assert dispatcher.take("c", 10, 3, never, 4.0) == [1]
    assert dispatcher.redeliveries([1]) == [2]
    dispatcher.acknowledged([1])
    assert dispatcher.redeliveries([1]) == [0]  # acknowledged: forgotten


def test_ack_timeout_redelivers_only_expired_holds() -> None:
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    never = set().__contains__
    assert dispatcher.take("a", 2, 4, never, 0.0) == [0, 1]
    assert dispatcher.take("b", 2, 4, never, 5.0) == [2, 3]
    assert dispatcher.take("c", 10, 4, never, TIMEOUT - 0.001) == []
    assert dispatcher.take("c", 10, 4, never, TIMEOUT) == [0, 1]
    assert dispatcher.take("d", 10, 4, never, 5.0 + TIMEOUT) == [2, 3]
    # The redelivered holds got fresh deadlines: nothing else expires yet.
    assert dispatcher.take("e", 10, 4, never, 2 * TIMEOUT - 0.001) == []


def test_ack_timeout_does_not_expire_a_later_hold_of_the_same_offset() -> None:
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    never = set().__contains__
    dispatcher.take("a", 1, 1, never, 0.0)
    dispatcher.negative_ack([0])
    assert dispatcher.take("b", 1, 1, never, 4.0) == [0]
    # a's old deadline passes, but b holds offset 0 until 4 + TIMEOUT.
    assert dispatcher.take("c", 1, 1, never, TIMEOUT + 1) == []
    assert dispatcher.take("c", 1, 1, never, TIMEOUT + 4) == [0]


def test_consumer_left_returns_its_offsets_only() -> None:
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    never = set().__contains__
    dispatcher.take("a", 3, 6, never, 0.0)
    dispatcher.take("b", 3, 6, never, 0.0)
    dispatcher.consumer_left("a")
    assert dispatcher.in_flight == 3
    assert dispatcher.take("c", 10, 6, never, 0.0) == [0, 1, 2]
    dispatcher.consumer_left("nobody")
    assert dispatcher.in_flight == 6


def test_acked_offsets_are_never_handed_out_again() -> None:
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    acked = {1, 4}  # e.g. acked by a stream consumer before the queue started
    assert dispatcher.take("a", 10, 6, acked.__contains__, 0.0) == [0, 2, 3, 5]
    acked.update([0, 2])
    dispatcher.acknowledged([0, 2])
    dispatcher.negative_ack([0, 2, 3])  # late nack after the ack: only 3 comes back
    assert dispatcher.take("b", 10, 6, acked.__contains__, 1.0) == [3]
    acked.add(5)  # acked while held by a (late ack from an earlier holder)
    assert dispatcher.take("b", 10, 6, acked.__contains__, TIMEOUT + 1) == [3]
    assert dispatcher.in_flight == 1


def test_a_consumer_named_like_a_transaction_is_neither_taken_for_one_nor_frees_its_holds() -> None:
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    never = set().__contains__
    assert dispatcher.take("txn:t1", 2, 4, never, 0.0) == [0, 1]
    dispatcher.hold([0], "t2", never, 0.0, HOLD)  # no conflict: a consumer held it
    assert dispatcher.take("c", 4, 4, never, 0.0) == [2, 3]
    dispatcher.hold([2, 3], "t1", never, 0.0, HOLD)
    dispatcher.consumer_left("txn:t1")  # its offset 1 goes back; t1's holds stay
    assert dispatcher.take("d", 4, 4, never, 1.0) == [1]
    with pytest.raises(TransactionConflictError, match="transaction t1"):
        dispatcher.hold([3], "t3", never, 1.0, HOLD)


def test_stale_negative_ack_does_not_release_another_consumers_hold() -> None:
    """a's hold times out and b gets the offset; a's late nack must not free b's hold."""
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    never = set().__contains__
    assert dispatcher.take("a", 1, 1, never, 0.0) == [0]
    assert dispatcher.take("b", 1, 1, never, TIMEOUT) == [0]
    dispatcher.negative_ack([0], consumer="a")
    assert dispatcher.take("c", 1, 1, never, TIMEOUT + 1) == []
    dispatcher.negative_ack([0], consumer="b")
    assert dispatcher.take("c", 1, 1, never, TIMEOUT + 1) == [0]


def test_initial_next_offset_skips_the_acknowledged_prefix() -> None:
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT, next_offset=7)
    assert dispatcher.take("a", 10, 9, set().__contains__, 0.0) == [7, 8]


def test_a_transaction_holds_its_messages_past_the_ack_timeout_until_it_is_decided() -> None:
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    never = set().__contains__
    assert dispatcher.take("a", 3, 3, never, 0.0) == [0, 1, 2]
    dispatcher.hold([0, 1], "t1", never, 1.0, HOLD)
    assert dispatcher.take("b", 10, 3, never, TIMEOUT + 1) == [2]  # 0 and 1 stay held
    with pytest.raises(TransactionConflictError, match="transaction t1"):
        dispatcher.hold([1, 2], "t2", never, TIMEOUT + 2, HOLD)  # b took 2; t1 holds 1
    dispatcher.hold([2], "t2", never, TIMEOUT + 2, HOLD)  # b's message, its transaction
    dispatcher.consumer_left("b")  # what a transaction holds is not the consumer's
    assert dispatcher.release("t1") == [0, 1]  # t1 aborted: delivered again
    assert dispatcher.take("c", 10, 3, never, TIMEOUT + 3) == [0, 1]
    dispatcher.acknowledged([2])  # t2 committed
    assert dispatcher.in_flight == 2


def test_a_hold_never_recorded_ends_at_its_limit() -> None:
    """A coordinator that crashed between holding and recording never releases."""
    dispatcher = QueueDispatcher(ack_timeout_s=TIMEOUT)
    never = set().__contains__
    dispatcher.take("a", 1, 1, never, 0.0)
    dispatcher.hold([0], "lost", never, 0.0, HOLD)
    assert dispatcher.take("b", 1, 1, never, HOLD - 0.001) == []
    assert dispatcher.take("b", 1, 1, never, HOLD) == [0]


CONSUMERS = ("c0", "c1", "c2")
operation = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 8)),
    st.tuples(st.just("take"), st.sampled_from(CONSUMERS), st.integers(1, 6)),
    st.tuples(st.just("ack"), st.sampled_from(CONSUMERS), st.integers(0, 2**16)),
    st.tuples(st.just("late_ack"), st.integers(0, 64)),
    st.tuples(st.just("nack"), st.sampled_from(CONSUMERS), st.integers(0, 2**16)),
    st.tuples(st.just("stale_nack"), st.sampled_from(CONSUMERS), st.integers(0, 64)),
    st.tuples(st.just("leave"), st.sampled_from(CONSUMERS)),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 3.0, TIMEOUT, TIMEOUT + 0.5])),
    st.tuples(st.just("drain"), st.sampled_from(CONSUMERS)),
    st.tuples(st.just("hold"), st.sampled_from(("t0", "t1")), st.integers(0, 2**16)),
    st.tuples(st.just("release"), st.sampled_from(("t0", "t1"))),
)


def _pick(offsets: list[int], mask: int) -> list[int]:
    return [o for i, o in enumerate(sorted(offsets)) if mask >> (i % 16) & 1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, max_size=80))
def test_random_interleavings_keep_every_promise(ops: list[tuple]) -> None:
    model = Model(QueueDispatcher(ack_timeout_s=TIMEOUT))
    for op in ops:
        kind = op[0]
        if kind == "append":
            model.end += op[1]
        elif kind == "take":
            model.take(op[1], op[2])
        elif kind == "ack":
            model.ack(_pick([o for o, h in model.held.items() if h[0] == op[1]], op[2]))
        elif kind == "late_ack":
            if model.end:
                model.ack([op[1] % model.end])  # whoever holds it, if anyone
        elif kind == "nack":
            model.nack(op[1], _pick([o for o, h in model.held.items() if h[0] == op[1]], op[2]))
        elif kind == "stale_nack":
            # A consumer nacks an offset it may no longer hold (its hold timed out).
            if model.end:
                offset = op[2] % model.end
                model.dispatcher.negative_ack([offset], consumer=op[1])
                if model.held.get(offset, ("", 0))[0] == op[1]:
                    del model.held[offset]
        elif kind == "leave":
            model.leave(op[1])
        elif kind == "tick":
            model.now += op[1]
        elif kind == "hold":  # what a consumer took, or anything (a late acknowledgement)
            model.hold(op[1], _pick(list(range(model.end)), op[2]))
        elif kind == "release":
            model.release(op[1])
        elif kind == "drain":
            expected = model.available()
            assert set(model.take(op[1], EVERYTHING)) == expected
    # Liveness: acknowledging everything handed out eventually drains the queue.
    for _ in range(3):
        model.ack(list(model.held))
        model.now += TIMEOUT
        model.ack(model.take("c0", EVERYTHING))
    assert model.acked == set(range(model.end))
    assert model.dispatcher.in_flight == 0
    assert model.take("c1", EVERYTHING) == []
