"""Backlog age: the oldest unacknowledged message of each subscription, per segment and
over a topic, taken at the moment it is shown."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.backlog import BacklogAges, age_s, subscription_ages
from storage.cursors import Cursor
from storage.segment_stats import subscription_stats


def test_the_oldest_unacknowledged_record_skips_what_is_acknowledged_out_of_order() -> None:
    times = {offset: 1_000 + offset for offset in range(100)}
    cursor = Cursor("s", 10, [(12, 20)])  # 10, 11 unacknowledged, then 12-19 acknowledged
    stats = subscription_stats([cursor], 0, 100, times.get)
    assert stats["s"]["oldestUnackedMs"] == 1_010 and stats["s"]["backlog"] == 82
    below_start = subscription_stats([Cursor("s", 3, [(5, 9)])], 5, 100, times.get)
    assert below_start["s"]["oldestUnackedMs"] == 1_009  # retention took 3-4: 9 is first
    drained = subscription_stats([Cursor("s", 100)], 0, 100, times.get)
    assert drained["s"]["oldestUnackedMs"] is None and drained["s"]["backlog"] == 0
    unknown = subscription_stats([Cursor("s", 0)], 0, 100)  # a hibernating tiered segment
    assert unknown["s"]["oldestUnackedMs"] is None


def test_a_subscription_is_as_old_as_its_oldest_segment() -> None:
    segments = {
        0: {"subscriptions": {"a": {"oldestUnackedMs": 5_000}, "b": {"oldestUnackedMs": None}}},
        1: {"subscriptions": {"a": {"oldestUnackedMs": 8_000}, "b": {"oldestUnackedMs": 9_500}}},
    }
    assert subscription_ages(segments, 10_000) == {"a": 5.0, "b": 0.5}
    assert age_s(None, 10_000) == 0.0 and age_s(11_000, 10_000) == 0.0  # clocks apart


@given(
    st.lists(st.one_of(st.none(), st.integers(0, 10**6)), min_size=1, max_size=10),
    st.integers(0, 2 * 10**6),
)
def test_the_topic_age_is_the_largest_segment_age(oldest: list, now_ms: int) -> None:
    segments = {i: {"subscriptions": {"s": {"oldestUnackedMs": o}}} for i, o in enumerate(oldest)}
    assert subscription_ages(segments, now_ms)["s"] == max(age_s(o, now_ms) for o in oldest)


def test_ages_are_retaken_between_rounds_and_a_cleared_pair_is_zeroed_once() -> None:
    ages = BacklogAges()
    left, right = "0000-7fff-1", "8000-ffff-2"  # segments as metrics tag them
    ages.observe(
        {left: {"subscriptions": {"a": {"oldestUnackedMs": 5_000}, "b": {"oldestUnackedMs": None}}},
         right: {"subscriptions": {"a": {"oldestUnackedMs": 8_000}}}},
        ["a", "b", "idle"],
    )  # fmt: skip
    assert ages.subscription_ages(10_000) == {"a": 5.0, "b": 0.0, "idle": 0.0}
    assert ages.subscription_ages(12_500) == {"a": 7.5, "b": 0.0, "idle": 0.0}
    assert ages.segment_ages(12_500) == {(left, "a"): 7.5, (right, "a"): 4.5}
    ages.observe({left: {"subscriptions": {"a": {"oldestUnackedMs": None}}},
                  right: {"subscriptions": {"a": {"oldestUnackedMs": 8_000}}}}, ["a"])  # fmt: skip
    assert ages.segment_ages(13_000) == {(left, "a"): 0.0, (right, "a"): 5.0}
    assert ages.segment_ages(14_000) == {(right, "a"): 6.0}  # the zero was exported once
    assert ages.subscription_ages(14_000) == {"a": 6.0}
    assert ages.growing()
    ages.observe({right: {"subscriptions": {"a": {"oldestUnackedMs": None}}}}, ["a"])
    assert ages.growing()  # the pair acknowledged since is still to be zeroed
    assert ages.segment_ages(15_000) == {(right, "a"): 0.0}
    assert not ages.growing()  # nothing owed: no export between rounds until one is


@given(
    st.lists(st.one_of(st.none(), st.integers(0, 10**6)), min_size=1, max_size=10),
    st.integers(0, 2 * 10**6),
)
def test_retaken_ages_equal_ages_taken_from_the_stats(oldest: list, now_ms: int) -> None:
    segments = {i: {"subscriptions": {"s": {"oldestUnackedMs": o}}} for i, o in enumerate(oldest)}
    ages = BacklogAges()
    ages.observe(segments, ["s"])
    assert ages.subscription_ages(now_ms) == subscription_ages(segments, now_ms)
