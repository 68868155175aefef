import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from runtime.errors import (
    InconsistentRequestError,
    InvalidArgumentError,
    InvalidLayoutError,
    SegmentNotActiveError,
    SegmentNotFoundError,
    SegmentsNotAdjacentError,
    SegmentTooNarrowError,
)
from runtime.layout import MAX_SEGMENTS, SegmentLayout, SegmentState
from runtime.operations import apply_operation, plan_merge

SPEC_EXAMPLE = """{
  "epoch": 3,
  "nextSegmentId": 5,
  "segments": {
    "0": { "segmentId": 0, "hashRange": {"start": 0, "end": 65535}, "state": "SEALED",
           "parentIds": [], "childIds": [1, 2], "createdAtEpoch": 0, "sealedAtEpoch": 1 },
    "1": { "segmentId": 1, "hashRange": {"start": 0, "end": 32767}, "state": "SEALED",
           "parentIds": [0], "childIds": [3, 4], "createdAtEpoch": 1, "sealedAtEpoch": 3 },
    "2": { "segmentId": 2, "hashRange": {"start": 32768, "end": 65535}, "state": "ACTIVE",
           "parentIds": [0], "childIds": [], "createdAtEpoch": 1, "sealedAtEpoch": 0 },
    "3": { "segmentId": 3, "hashRange": {"start": 0, "end": 16383}, "state": "ACTIVE",
           "parentIds": [1], "childIds": [], "createdAtEpoch": 3, "sealedAtEpoch": 0 },
    "4": { "segmentId": 4, "hashRange": {"start": 16384, "end": 32767}, "state": "ACTIVE",
           "parentIds": [1], "childIds": [], "createdAtEpoch": 3, "sealedAtEpoch": 0 }
  },
  "properties": {}
}"""


def assert_valid(layout: SegmentLayout) -> None:
    """The invariants every layout must hold after any sequence of operations."""
    layout.check_invariants()
    active = sorted(layout.active_segments.values(), key=lambda s: s.hash_range.start)
    assert active, "a topic always has active segments"
    assert active[0].hash_range.start == 0 and active[-1].hash_range.end == 0xFFFF
    for left, right in zip(active, active[1:], strict=False):
        assert left.hash_range.end + 1 == right.hash_range.start, "gap or overlap"
    all_ids = list(layout.all_segments)
    assert len(set(all_ids)) == len(all_ids)
    assert all(i < layout.next_segment_id for i in all_ids)
    for seg in layout.all_segments.values():
        assert (seg.state is SegmentState.ACTIVE) == (not seg.child_ids)
        assert seg.sealed_at_epoch == 0 if seg.is_active else seg.sealed_at_epoch > 0
        for child in seg.child_ids:
            if child in layout.all_segments:
                assert seg.segment_id in layout.all_segments[child].parent_ids
                assert layout.all_segments[child].created_at_epoch == seg.sealed_at_epoch
        for parent in seg.parent_ids:
            if parent in layout.all_segments:
                assert seg.segment_id in layout.all_segments[parent].child_ids
    for seg in active:
        for h in (seg.hash_range.start, seg.hash_range.end):
            assert layout.find_active_segment(h).segment_id == seg.segment_id


def test_spec_example_round_trips_exactly():
    layout = SegmentLayout.from_json(SPEC_EXAMPLE)
    assert json.loads(layout.to_json()) == json.loads(SPEC_EXAMPLE)
    assert SegmentLayout.from_json(layout.to_json()) == layout
    assert_valid(layout)


def test_splitting_segment_2_of_spec_example():
    layout = SegmentLayout.from_json(SPEC_EXAMPLE).split_segment(2)
    doc = json.loads(layout.to_json())
    assert doc["epoch"] == 4 and doc["nextSegmentId"] == 7
    assert doc["segments"]["5"]["hashRange"] == {"start": 32768, "end": 49151}
    assert doc["segments"]["6"]["hashRange"] == {"start": 49152, "end": 65535}
    assert doc["segments"]["5"]["parentIds"] == [2] and doc["segments"]["5"]["state"] == "ACTIVE"
    assert doc["segments"]["5"]["createdAtEpoch"] == 4
    two = doc["segments"]["2"]
    assert (two["state"], two["sealedAtEpoch"], two["childIds"]) == ("SEALED", 4, [5, 6])
    assert_valid(layout)


def test_initial_layout_is_near_equal():
    layout = SegmentLayout.initial(3)
    widths = [s.hash_range.width for s in layout.active_segments.values()]
    assert sum(widths) == MAX_SEGMENTS and max(widths) - min(widths) <= 1
    assert_valid(SegmentLayout.initial(MAX_SEGMENTS))


@pytest.mark.parametrize("n", [0, -1, MAX_SEGMENTS + 1, 2.5, "4", None])
def test_initial_rejects_bad_counts(n):
    with pytest.raises(InvalidArgumentError, match="num_segments"):
        SegmentLayout.initial(n)


def test_invalid_requests_raise_typed_errors_and_change_nothing():
    layout = SegmentLayout.initial(4)
    split = layout.split_segment(0)
    cases = [
        (lambda: layout.split_segment(99), SegmentNotFoundError, "99"),
        (lambda: split.split_segment(0), SegmentNotActiveError, "SEALED"),
        (lambda: split.merge_segments(0, 1), SegmentNotActiveError, "SEALED"),
        (lambda: layout.merge_segments(0, 2), SegmentsNotAdjacentError, "adjacent"),
        (lambda: layout.merge_segments(1, 1), SegmentsNotAdjacentError, "itself"),
        (lambda: layout.prune_segment(1), SegmentNotActiveError, "ACTIVE"),
        (lambda: split.split_segment(4).prune_segment(4), SegmentNotActiveError, "parents"),
        (lambda: layout.find_active_segment(70000), InvalidArgumentError, "outside"),
    ]
    before = layout.to_json()
    for call, err, text in cases:
        with pytest.raises(err, match=text):
            call()
    assert layout.to_json() == before


def test_a_split_at_a_hash_starts_the_upper_child_there():
    """As Kinesis's ``NewStartingHashKey``: one split isolates a hot range of any width."""
    layout = SegmentLayout.initial(2)  # #0 [0000-7fff], #1 [8000-ffff]
    split = layout.split_segment(1, at=0x8A00)
    lower, upper = (split.all_segments[i].hash_range for i in (2, 3))
    assert (lower.start, lower.end, upper.start, upper.end) == (0x8000, 0x89FF, 0x8A00, 0xFFFF)
    assert split.find_active_segment(0x89FF).segment_id == 2
    assert split.find_active_segment(0x8A00).segment_id == 3
    assert layout.split_segment(1) == layout.split_segment(1, at=0xC000)  # the default
    narrowest = layout.split_segment(0, at=1)  # a one-wide lower child
    assert narrowest.all_segments[2].hash_range.width == 1
    assert_valid(split)
    assert_valid(narrowest)
    before = layout.to_json()
    # outside the segment's range: what only the layout rules out (409, not 400)
    for bad in (0x8000, 0x7FFF, 0x10000, -1):
        with pytest.raises(InconsistentRequestError, match=r"\[0x8001, 0xffff\]"):
            layout.split_segment(1, at=bad)
    for bad in (True, 3.5, "0x8a00"):
        with pytest.raises(InvalidArgumentError, match="a hash or a non-empty list"):
            layout.split_segment(1, at=bad)
    assert layout.to_json() == before


def test_a_split_into_several_gives_a_single_hot_hash_a_segment_of_its_own():
    layout = SegmentLayout.initial(1)
    split = layout.split_segment(0, [0x8A00, 0x8A01])
    spans = [(s.hash_range.start, s.hash_range.end) for s in split.active_segments.values()]
    assert spans == [(0x0000, 0x89FF), (0x8A00, 0x8A00), (0x8A01, 0xFFFF)]
    assert split.all_segments[0].child_ids == (1, 2, 3) and split.next_segment_id == 4
    assert_valid(split)
    assert layout.split_segment(0, [0x8A00]) == layout.split_segment(0, 0x8A00)
    for bad in ([0x8A01, 0x8A00], [0x10, 0x10], [0, 0x10], [0x10, 0x10000]):
        with pytest.raises(InconsistentRequestError, match="ascending order"):
            layout.split_segment(0, bad)
    for bad in ([], [0x10, "0x20"]):
        with pytest.raises(InvalidArgumentError, match="a hash or a non-empty list"):
            layout.split_segment(0, bad)
    with pytest.raises(InvalidArgumentError, match="at most 64 children"):
        layout.split_segment(0, list(range(1, 65)))
    assert len(layout.split_segment(0, list(range(1, 64))).active_segments) == 64


def test_a_split_into_parts_gives_near_equal_children():
    layout = SegmentLayout.initial(2)  # #1 [8000-ffff]
    split = layout.split_segment(1, parts=3)
    widths = [s.hash_range.width for s in split.active_segments.values() if s.segment_id > 1]
    assert len(widths) == 3 and sum(widths) == 0x8000 and max(widths) - min(widths) <= 1
    assert_valid(split)
    for parts in (1, True, 2.0):
        with pytest.raises(InvalidArgumentError, match="2 or more"):
            layout.split_segment(1, parts=parts)
    with pytest.raises(InconsistentRequestError, match="2 to 64"):
        layout.split_segment(1, parts=65)
    with pytest.raises(InconsistentRequestError, match="at or parts, not both"):
        layout.split_segment(1, 0x9000, parts=2)
    three_wide = SegmentLayout.initial(1).split_segment(0, [3, 6]).get(2)  # [0003, 0005]
    with pytest.raises(InconsistentRequestError, match="2 to 3"):
        SegmentLayout.initial(1).split_segment(0, [3, 6]).split_segment(2, parts=4)
    assert three_wide.hash_range.width == 3


def test_a_run_of_neighbours_merges_in_one_operation_given_in_any_order():
    layout = SegmentLayout.initial(4)  # [0000-3fff] [4000-7fff] [8000-bfff] [c000-ffff]
    merged = layout.merge_segments(2, 0, 1)
    child = merged.get(4)
    assert (child.hash_range.start, child.hash_range.end) == (0x0000, 0xBFFF)
    assert child.parent_ids == (0, 1, 2) and merged.get(1).child_ids == (4,)
    assert_valid(merged)
    plan = plan_merge(layout, 2, 0, "r", [1])
    assert plan.parents == (0, 1, 2) and apply_operation(layout, plan) == merged
    before = layout.to_json()
    for ids, text in (((0, 2, 3), "not adjacent"), ((0, 1, 1), "appears twice")):
        with pytest.raises(SegmentsNotAdjacentError, match=text):
            layout.merge_segments(*ids)
    with pytest.raises(InvalidArgumentError, match="at most 64 segments"):
        SegmentLayout.initial(65).merge_segments(*range(65))
    assert layout.to_json() == before


@settings(max_examples=200)
@given(st.integers(0, MAX_SEGMENTS - 2), st.data())
def test_a_split_anywhere_covers_its_parent_exactly(start: int, data) -> None:
    end = data.draw(st.integers(start + 1, MAX_SEGMENTS - 1))
    at = data.draw(st.integers(start + 1, end))
    layout = SegmentLayout.initial(1)
    if start > 0:
        layout = layout.split_segment(0, at=start)
        segment = max(layout.active_segments)
    else:
        segment = 0
    if end < MAX_SEGMENTS - 1:
        layout = layout.split_segment(segment, at=end + 1)
        segment = min(
            s for s, info in layout.active_segments.items() if info.hash_range.start == start
        )
    split = layout.split_segment(segment, at=at)
    children = [split.all_segments[c].hash_range for c in split.all_segments[segment].child_ids]
    assert [(c.start, c.end) for c in children] == [(start, at - 1), (at, end)]
    assert_valid(split)


def test_one_wide_range_cannot_split():
    layout = SegmentLayout.initial(MAX_SEGMENTS)
    with pytest.raises(SegmentTooNarrowError, match="one-wide"):
        layout.split_segment(7)


def test_lineage_and_prune():
    layout = SegmentLayout.initial(2).split_segment(0).merge_segments(3, 1)
    assert [s.segment_id for s in layout.get_lineage(2)] == [0, 2]
    assert [s.segment_id for s in layout.get_lineage(1)] == [1, 4]
    assert [s.segment_id for s in layout.get_lineage(0)] == [0, 2, 3, 4]
    pruned = layout.prune_segment(0)
    assert 0 not in pruned.all_segments and pruned.all_segments[2].parent_ids == ()
    assert pruned.epoch == layout.epoch + 1
    assert_valid(pruned)


def test_check_invariants_catches_broken_dags():
    doc = json.loads(SPEC_EXAMPLE)
    doc["segments"]["4"]["hashRange"]["start"] = 16000  # overlaps segment 3
    with pytest.raises(InvalidLayoutError, match="overlap"):
        SegmentLayout.from_dict(doc).check_invariants()
    doc = json.loads(SPEC_EXAMPLE)
    doc["segments"]["1"]["childIds"] = [3]  # 4 lists 1 as parent, 1 forgot 4
    with pytest.raises(InvalidLayoutError, match="does not list child"):
        SegmentLayout.from_dict(doc).check_invariants()


def test_malformed_json_is_a_clear_error():
    for bad in ["{", '{"epoch": 0}', SPEC_EXAMPLE.replace('"SEALED"', '"BROKEN"', 1)]:
        with pytest.raises(InvalidArgumentError, match="ScalableTopicMetadata"):
            SegmentLayout.from_json(bad)


def test_layout_is_immutable():
    layout = SegmentLayout.initial(2)
    with pytest.raises(TypeError):
        layout.all_segments[5] = None
    with pytest.raises(ValidationError):
        layout.all_segments[0].state = SegmentState.SEALED


operations = st.lists(
    st.tuples(st.sampled_from(["split", "merge", "prune"]), st.integers(0, 10_000)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 16), operations)
def test_random_operation_sequences_keep_every_invariant(initial, ops):
    layout = SegmentLayout.initial(initial)
    assert_valid(layout)
    for op, pick in ops:
        active = list(layout.active_segments.values())
        sealed = [s for s in layout.all_segments.values() if not s.is_active and not s.parent_ids]
        if op == "split":
            target = active[pick % len(active)]
            if target.hash_range.width < 2:
                continue
            new = layout.split_segment(target.segment_id)
        elif op == "merge" and len(active) > 1:
            i = pick % (len(active) - 1)
            new = layout.merge_segments(active[i + 1].segment_id, active[i].segment_id)
        elif op == "prune" and sealed:
            new = layout.prune_segment(sealed[pick % len(sealed)].segment_id)
        else:
            continue
        assert new.epoch == layout.epoch + 1
        assert new.next_segment_id >= layout.next_segment_id
        created = set(new.all_segments) - set(layout.all_segments)
        assert all(i >= layout.next_segment_id for i in created), "ids are monotonic"
        assert SegmentLayout.from_json(new.to_json()) == new
        assert_valid(new)
        layout = new
