"""DAG order and sticky balancing (``runtime.assignment``, ``SegmentLayout.readable``),
over layouts grown by random splits, merges and prunes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.assignment import Share, assign, assign_shares, readable_segments
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


def _tiles(shares: list[Share]) -> bool:
    """Whether one segment's shares hold every bucket exactly once."""
    if len(shares) == 1 and shares[0].whole:
        return True
    ranges = sorted((s.start, s.end, s.count) for s in shares)
    counts = {c for _, _, c in ranges}
    edges = [0] + [end for _, end, _ in ranges]
    return (
        len(counts) == 1
        and all(s.start == e for s, e in zip(sorted(shares), edges, strict=False))
        and edges[-1] == counts.pop()
    )


@settings(max_examples=300)
@given(
    histories(),
    st.lists(st.sampled_from([f"c{i}" for i in range(12)]), max_size=12),
    st.lists(st.sampled_from([f"c{i}" for i in range(12)]), max_size=12),
    st.sampled_from([1, 2, 3, 256]),
)
def test_more_consumers_than_segments_share_them_by_key_buckets(
    history: tuple[SegmentLayout, set[int]], before: list[str], consumers: list[str], buckets: int
) -> None:
    """Every readable segment's buckets are held exactly once; past one consumer a
    segment, every consumer holds one share (while the buckets go round); what a
    balanced assignment gave stays, and the order of the names does not matter."""
    layout, finished = history
    readable = readable_segments(layout, finished)
    names = sorted(set(consumers))
    current = assign_shares(readable, before, {}, buckets)
    owners = assign_shares(readable, consumers, current, buckets)
    if not names:
        assert owners == {}
        return
    for info in readable:
        assert _tiles([s for s in owners if s.segment_id == info.segment_id]), owners
    assert {s.segment_id for s in owners} == {i.segment_id for i in readable}
    if len(names) > len(readable) and buckets > 1:
        held = list(owners.values())
        assert len(held) == len(set(held))  # one share a consumer
        assert len(held) == min(len(names), len(readable) * buckets)
    assert assign_shares(readable, consumers, owners, buckets) == owners
    assert assign_shares(readable, list(reversed(consumers)), current, buckets) == owners


def test_a_joining_consumer_cuts_one_segment_and_only_its_buckets_move() -> None:
    readable = readable_segments(SegmentLayout.initial(4), set())
    four = assign_shares(readable, "abcd", {}, 256)
    assert sorted(four) == [Share(i) for i in range(4)]
    five = assign_shares(readable, "abcde", four, 256)
    cut = sorted(s for s in five if not s.whole)
    assert [(s.start, s.end, s.count) for s in cut] == [(0, 128, 256), (128, 256, 256)]
    # the segment's owner keeps half of it; the other three segments stay put
    assert five[cut[0]] == four[Share(cut[0].segment_id)]
    assert {s: c for s, c in five.items() if s.whole}.items() <= four.items()
