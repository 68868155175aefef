"""DAG order and sticky balancing (``runtime.assignment``, ``SegmentLayout.readable``),
over layouts grown by random splits, merges and prunes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.assignment import assign, readable_segments
from runtime.errors import ScalableTopicsError
from runtime.layout import SegmentLayout


@st.composite
def histories(draw: st.DrawFn) -> tuple[SegmentLayout, set[int]]:
    """A layout after random operations, and a set of segments a reader finished that
    respects DAG order (a segment is finished only after its parents are)."""
    layout = SegmentLayout.initial(draw(st.integers(1, 8)))
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(("split", "merge", "prune")))
        ids = sorted(layout.all_segments)
        try:
            if kind == "split":
                layout = layout.split_segment(draw(st.sampled_from(ids)))
            elif kind == "merge":
                active = list(layout.active_segments)
                i = draw(st.integers(0, max(len(active) - 2, 0)))
                layout = layout.merge_segments(*active[i : i + 2])
            else:
                layout = layout.prune_segment(draw(st.sampled_from(ids)))
        except (ScalableTopicsError, TypeError):
            continue  # not applicable to this layout: draw another
    finished: set[int] = set()
    for _ in range(draw(st.integers(0, len(layout.all_segments)))):
        sealed = [s for s in layout.readable(finished) if not s.is_active]
        if not sealed:
            break
        finished.add(draw(st.sampled_from(sealed)).segment_id)
    return layout, finished


@given(histories())
def test_a_segment_is_readable_exactly_when_its_parents_in_the_layout_are_finished(
    history: tuple[SegmentLayout, set[int]],
) -> None:
    layout, finished = history
    readable = {s.segment_id for s in layout.readable(finished)}
    for segment_id, info in layout.all_segments.items():
        parents_done = all(p in finished or p not in layout.all_segments for p in info.parent_ids)
        assert (segment_id in readable) == (segment_id not in finished and parents_done)
    assert [s.segment_id for s in readable_segments(layout, finished)] == sorted(
        readable, key=lambda i: (layout.get(i).hash_range.start, i)
    )


@settings(max_examples=300)
@given(histories(), st.lists(st.sampled_from("abcde"), max_size=5), st.randoms())
def test_every_readable_segment_gets_one_owner_balanced_and_sticky(
    history: tuple[SegmentLayout, set[int]], consumers: list[str], rng
) -> None:
    layout, finished = history
    readable = readable_segments(layout, finished)
    names = sorted(set(consumers))
    current = {s.segment_id: rng.choice(names) for s in readable if names and rng.random() < 0.7}
    owners = assign(readable, consumers, current)
    if not names:
        assert owners == {}
        return
    assert set(owners) == {s.segment_id for s in readable}
    assert set(owners.values()) <= set(names)
    load = [list(owners.values()).count(n) for n in names]
    assert max(load) - min(load) <= 1
    assert assign(readable, consumers, owners) == owners  # a balanced assignment stays
    assert assign(readable, list(reversed(consumers)), current) == owners  # deterministic


def test_a_parent_missing_from_the_layout_holds_nothing_back() -> None:
    """A layout read while retention pruned a parent, or rebuilt from storage, may name a
    parent it no longer holds: nothing of it is left to read, so its children are readable."""
    split = SegmentLayout.initial(1).split_segment(0)
    segments = {i: s for i, s in split.all_segments.items() if i != 0}
    layout = SegmentLayout(split.epoch + 1, split.next_segment_id, segments, {})
    assert [s.segment_id for s in layout.readable(set())] == [1, 2]
    assert [s.segment_id for s in split.readable(set())] == [0]


def test_a_consumer_that_joins_gets_its_share_and_only_that_moves() -> None:
    readable = readable_segments(SegmentLayout.initial(4), set())
    before = {0: "a", 1: "a", 2: "b", 3: "b"}
    after = assign(readable, ["a", "b", "c"], before)
    assert sorted(list(after.values()).count(n) for n in "abc") == [1, 1, 2]
    assert sum(after[i] != before[i] for i in before) == 1
