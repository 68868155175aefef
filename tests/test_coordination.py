"""When a subscription's coordinator evicts silent consumers (``runtime.coordination``):
it sleeps until ``next_expiry`` instead of checking on a timer, so that deadline must
never pass a session that has expired, and never come before the first one does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.coordination import GroupState
from runtime.layout import SegmentLayout

GRACE_S = 30.0
times = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(st.dictionaries(st.sampled_from("abcdef"), times, min_size=1), times)
def test_nobody_expires_before_the_next_expiry_and_someone_just_after(
    seen: dict[str, float], now: float
) -> None:
    state = GroupState()
    for consumer, at in seen.items():
        state.join(consumer, at)
    due = state.next_expiry(GRACE_S)
    assert due is not None
    if now <= due:
        assert state.expired(now, GRACE_S) == []
    assert state.expired(due + 0.05, GRACE_S) != []


def test_a_consumer_heard_from_moves_only_its_own_deadline_later() -> None:
    state = GroupState()
    assert state.next_expiry(GRACE_S) is None  # nothing to expire: the coordinator waits
    state.join("a", 10.0)
    state.join("b", 20.0)
    assert state.next_expiry(GRACE_S) == 40.0
    state.seen("a", 25.0)
    assert state.next_expiry(GRACE_S) == 50.0
    assert state.expired(50.1, GRACE_S) == ["b"]
    state.leave("b")
    assert state.next_expiry(GRACE_S) == 55.0


def test_a_state_built_anew_hands_out_no_version_a_consumer_may_hold_from_before() -> None:
    """A coordinator that restarts builds its group state anew. Were its versions to count
    from where the last one's did, a consumer holding version v of the old assignment
    (two parents) would take the new one's v (their merged child) for the one it has,
    and never read on: what chaos seed 2 once showed, after a merge and a coordinator kill."""
    parents = SegmentLayout.initial(2)
    before = GroupState(version_base=1_000)
    before.join("a", 0.0)
    before.rebalance(parents)
    held = before.sessions["a"].version
    assert before.view("a") == (0, 1) and held > 1_000
    after = GroupState(version_base=2_000)  # a later incarnation: a later start
    after.join("a", 1.0)
    for _ in range(held - 1_000):  # as many changes as the first saw
        after.rebalance(parents)
    assert after.sessions["a"].version != held
