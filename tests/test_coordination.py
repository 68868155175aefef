"""When a subscription's coordinator evicts silent consumers (``runtime.coordination``):
it sleeps until ``next_expiry`` instead of checking on a timer, so that deadline must
never pass a session that has expired, and never come before the first one does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.coordination import GroupState

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
