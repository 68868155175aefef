"""Autoscale and retention decisions as pure functions: unit and property tests, no Ray."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.autoscale import (
    AckCounter,
    LoadTracker,
    Rate,
    consumer_split_threshold,
    decide,
    lineage_merges,
)
from runtime.errors import InconsistentRequestError, InvalidArgumentError
from runtime.layout import SegmentLayout
from runtime.policy import AutoscalePolicy, RetentionPolicy, TopicPolicy
from runtime.retention import SealedSegmentState, prunable

POLICY = AutoscalePolicy(
    target_msgs_per_s=100, scale_factor=2, min_segments=1, max_segments=8, cooldown_s=5
)


def rates_of(layout: SegmentLayout, msgs: list[float]) -> dict[int, Rate]:
    return {i: Rate(m, 0) for i, m in zip(layout.active_segments, msgs, strict=True)}


def test_hot_segment_splits_and_cold_neighbours_merge() -> None:
    layout = SegmentLayout.initial(2)
    split = decide(POLICY, layout, rates_of(layout, [30, 250]), now=100, last_change_at=None)
    assert (split.kind, split.segment_ids) == ("split", (1,))
    merge = decide(POLICY, layout, rates_of(layout, [20, 25]), now=100, last_change_at=None)
    assert (merge.kind, merge.segment_ids) == ("merge", (0, 1))
    # between the thresholds (50 < load < 100 per pair): hysteresis band, nothing happens
    assert decide(POLICY, layout, rates_of(layout, [30, 40]), now=100, last_change_at=None) is None


def test_cool_down_unmeasured_segments_and_bounds_hold_back() -> None:
    layout = SegmentLayout.initial(2)
    hot = rates_of(layout, [500, 500])
    assert decide(POLICY, layout, hot, now=100, last_change_at=97) is None
    assert decide(POLICY, layout, {0: Rate(500, 0)}, now=100, last_change_at=None) is None
    capped = POLICY.model_copy(update={"max_segments": 2})
    assert decide(capped, layout, hot, now=100, last_change_at=None) is None
    floor = POLICY.model_copy(update={"min_segments": 2})
    assert decide(floor, layout, rates_of(layout, [0, 0]), now=100, last_change_at=None) is None
    grow = POLICY.model_copy(update={"min_segments": 3})
    assert decide(grow, layout, {}, now=100, last_change_at=None).kind == "split"


def test_bytes_target_counts_too() -> None:
    policy = AutoscalePolicy(target_bytes_per_s=1000, cooldown_s=0)
    layout = SegmentLayout.initial(1)
    assert decide(policy, layout, {0: Rate(1, 5000)}, 0, None).kind == "split"


def test_load_tracker_needs_a_whole_window() -> None:
    tracker = LoadTracker()
    tracker.observe(0.0, {0: (0, 0)})
    tracker.observe(0.5, {0: (50, 500), 1: (0, 0)})
    assert tracker.rates(0.5, 1.0) == {}
    tracker.observe(1.0, {0: (100, 1000), 1: (10, 10)})
    assert tracker.rates(1.0, 1.0) == {0: Rate(100.0, 1000.0)}
    tracker.observe(2.0, {1: (110, 10)})  # segment 0 is gone: forgotten
    assert set(tracker.rates(2.0, 1.0)) == {1}


@st.composite
def layouts(draw) -> SegmentLayout:
    layout = SegmentLayout.initial(draw(st.integers(1, 4)))
    for _ in range(draw(st.integers(0, 6))):
        active = list(layout.active_segments)
        if draw(st.booleans()) or len(active) < 2:
            layout = layout.split_segment(draw(st.sampled_from(active)))
        else:
            i = draw(st.integers(0, len(active) - 2))
            layout = layout.merge_segments(active[i], active[i + 1])
    return layout


@settings(max_examples=200, deadline=None)
@given(
    layout=layouts(),
    loads=st.lists(st.floats(0, 1000), min_size=16, max_size=16),
    share=st.floats(0, 1),
    factor=st.floats(1.01, 10),
    consumers=st.integers(0, 20),
    consumer_load=st.floats(0, 1),
)
def test_a_change_is_never_undone_by_the_next_decision(
    layout, loads, share, factor, consumers, consumer_load
) -> None:
    """Whatever the rates and the stream consumers: a split's halves are not merged
    back, a merge not split again."""
    policy = POLICY.model_copy(
        update={"scale_factor": factor, "max_segments": 64, "consumer_split_load": consumer_load}
    )
    rates = rates_of(layout, loads[: len(layout.active_segments)])
    decision = decide(policy, layout, rates, now=100, last_change_at=None, consumers=consumers)
    if decision is None or decision.kind == "rebucket":
        return
    if decision.kind == "split":
        (parent,) = decision.segment_ids
        after = layout.split_segment(parent)
        a, b = after.next_segment_id - 2, after.next_segment_id - 1
        total = rates[parent].msgs_per_s
        rates.update({a: Rate(total * share, 0), b: Rate(total * (1 - share), 0)})
        undo = ("merge", (a, b))
    else:
        after = layout.merge_segments(*decision.segment_ids)
        merged = after.next_segment_id - 1
        rates[merged] = Rate(sum(rates[i].msgs_per_s for i in decision.segment_ids), 0)
        undo = ("split", (merged,))
    after.check_invariants()
    for joined in {consumers, 0, 20}:  # consumers leave or join after it, too
        again = decide(policy, after, rates, now=1000, last_change_at=100, consumers=joined)
        assert again is None or (again.kind, again.segment_ids) != undo


def test_consumers_outnumbering_segments_split_a_busy_one_or_share_an_idle_one() -> None:
    layout = SegmentLayout.initial(2)
    busy = rates_of(layout, [20, 60])  # 0.6 of target: above consumerSplitLoad's 0.5
    split = decide(POLICY, layout, busy, now=100, last_change_at=None, consumers=5)
    assert (split.kind, split.segment_ids) == ("split", (1,)), split
    idle = rates_of(layout, [1, 2])
    rebucket = decide(POLICY, layout, idle, now=100, last_change_at=None, consumers=5)
    assert (rebucket.kind, rebucket.segment_ids) == ("rebucket", ())
    assert "5 stream consumers on 2 segments" in rebucket.reason
    # as many consumers as segments: the cold pair merges as before
    assert decide(POLICY, layout, idle, now=100, last_change_at=None, consumers=2).kind == "merge"
    full = POLICY.model_copy(update={"max_segments": 2})
    assert decide(full, layout, busy, now=100, last_change_at=None, consumers=5).kind == "rebucket"
    # the threshold never sits below where segments merge (1 / scaleFactor)
    loose = POLICY.model_copy(update={"consumer_split_load": 0.1, "scale_factor": 4})
    low = rates_of(layout, [20, 20])  # 0.2: above 0.1, below 1 / 4
    assert decide(loose, layout, low, now=100, last_change_at=None, consumers=5).kind == "rebucket"
    assert consumer_split_threshold(loose) == 0.25


def test_what_subscriptions_acknowledge_is_a_load_too() -> None:
    policy = AutoscalePolicy(target_output_msgs_per_s=100, cooldown_s=0)
    layout = SegmentLayout.initial(1)
    assert decide(policy, layout, {0: Rate(1, 1, 250)}, 0, None).kind == "split"
    assert decide(policy, layout, {0: Rate(500, 10**9, 50)}, 0, None) is None  # writes: no target
    counter = AckCounter()
    assert counter.observe({0: {"a": 100}}) == {0: 0}  # first seen: nothing read yet
    assert counter.observe({0: {"a": 150, "b": 900}}) == {0: 50}  # b is new
    assert counter.observe({0: {"a": 160, "b": 950}}) == {0: 110}
    assert counter.observe({0: {"a": 10, "b": 960}}) == {0: 120}  # a reset back: no less
    assert counter.observe({1: {"a": 5}}) == {1: 0}  # segment 0 is gone: forgotten
    tracker = LoadTracker()
    tracker.observe(0.0, {0: (0, 0, 0)})
    tracker.observe(2.0, {0: (10, 100, 400)})
    assert tracker.rates(2.0, 2.0) == {0: Rate(5.0, 50.0, 200.0)}


def test_merges_per_lineage_are_capped() -> None:
    layout = SegmentLayout.initial(2).merge_segments(0, 1).split_segment(2)  # 3, 4 active
    assert lineage_merges(layout, 3) == 1 and lineage_merges(layout, 2) == 1
    assert lineage_merges(layout, 0) == 0 and lineage_merges(layout, 99) == 0
    cold = {3: Rate(1, 0), 4: Rate(1, 0)}
    assert decide(POLICY, layout, cold, 100, None).kind == "merge"
    once = POLICY.model_copy(update={"max_merges_per_lineage": 1})
    assert decide(once, layout, cold, 100, None) is None
    twice = POLICY.model_copy(update={"max_merges_per_lineage": 2})
    assert decide(twice, layout, cold, 100, None).segment_ids == (3, 4)


def test_policy_validation_is_typed() -> None:
    parsed = TopicPolicy.parse({"autoscale": {"targetMsgsPerS": 10}, "retention": {"timeS": 0}})
    assert parsed.to_dict()["autoscale"]["targetMsgsPerS"] == 10
    with pytest.raises(InconsistentRequestError, match="minSegments 5 > maxSegments 2"):
        TopicPolicy.parse({"autoscale": {"targetMsgsPerS": 10, "minSegments": 5, "maxSegments": 2}})
    assert TopicPolicy.parse({"retention": {"sizeBytes": 10.0}}).retention.size_bytes == 10
    for bad in (
        {"autoscale": {}},
        {"autoscale": {"targetBytesPerS": None}},
        {"retention": {"sizeBytes": 10.5}},
        {"autoscale": {"targetMsgsPerS": 10, "scaleFactor": 1}},
        {"autoscale": {"targetMsgsPerS": "10"}},
        {"retention": {"sizeBytes": -1}},
        {"unknown": 1},
    ):
        with pytest.raises(InvalidArgumentError):
            TopicPolicy.parse(bad)


def chain(cycles: int) -> SegmentLayout:
    """One segment split and merged back ``cycles`` times: a long chain of sealed roots."""
    layout = SegmentLayout.initial(1)
    for _ in range(cycles):
        (only,) = layout.active_segments
        layout = layout.split_segment(only)
        layout = layout.merge_segments(*layout.active_segments)
    return layout


def test_prunable_walks_down_from_the_roots() -> None:
    layout = chain(3)  # 0 -> (1, 2) -> 3 -> (4, 5) -> 6 -> (7, 8) -> 9
    drained = SealedSegmentState(terminated=True, drained=True, last_publish_ms=0)
    states = {i: drained for i in layout.all_segments if i != 9}
    keep_all = RetentionPolicy(time_s=10)
    assert prunable(layout, states, keep_all, now_ms=5_000) == []
    assert prunable(layout, states, keep_all, now_ms=20_000) == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    states[4] = SealedSegmentState(terminated=True, drained=False, last_publish_ms=0)
    assert prunable(layout, states, RetentionPolicy(), now_ms=0) == [0, 1, 2, 3, 5]
    del states[0]  # no answer from segment 0: keep it, and everything below it
    assert prunable(layout, states, RetentionPolicy(), now_ms=0) == []
    pruned = layout
    for segment_id in [0, 1, 2, 3, 5]:
        pruned = pruned.prune_segment(segment_id)
    pruned.check_invariants()
    assert pruned.get(6).parent_ids == (4,)
