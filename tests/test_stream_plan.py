"""Read planning over the DAG (``runtime.stream_plan``), without Ray: a simulated topic is
produced to, split, merged and pruned while a query plans batch after batch, or while
a snapshot is planned; whatever happens, the batches hold every record once and each
key in order, and a snapshot a prefix of each key's history."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.errors import (
    ConflictError,
    InconsistentRequestError,
    InvalidArgumentError,
    ScalableTopicsError,
    SegmentNotFoundError,
    UnavailableSegmentsError,
)
from runtime.layout import SegmentLayout
from runtime.stream_plan import (
    EARLIEST,
    LATEST,
    SegmentOffsets,
    StreamPosition,
    behind,
    initial_position,
    next_position,
    ranges_between,
    snapshot_end,
    snapshot_ranges,
    snapshot_segments,
)


class Topic:
    """Segments as lists of (key, sequence) records, routed by a key's hash as the real
    producer routes them; sealing is splitting or merging in the layout."""

    def __init__(self, segments: int) -> None:
        self.layout = SegmentLayout.initial(segments)
        self.records: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self.start: dict[int, int] = defaultdict(int)  # what retention deleted
        self.sent: dict[int, int] = defaultdict(int)

    def produce(self, key: int) -> None:
        segment = self.layout.find_active_segment(key * 2654435761 % 65536).segment_id
        self.records[segment].append((key, self.sent[key]))
        self.sent[key] += 1

    def offsets(self) -> dict[int, SegmentOffsets]:
        return {
            s: SegmentOffsets(self.start[s], len(self.records[s])) for s in self.layout.all_segments
        }


def apply(topic: Topic, actions: list[tuple[str, int]]) -> None:
    for action, arg in actions:
        active = sorted(topic.layout.active_segments)
        if action == "produce":
            topic.produce(arg)
        elif action == "split":
            segment = active[arg % len(active)]
            if topic.layout.get(segment).hash_range.width > 1:
                topic.layout = topic.layout.split_segment(segment)
        elif action == "merge" and len(active) > 1:
            ordered = list(topic.layout.active_segments.values())
            i = arg % (len(ordered) - 1)
            topic.layout = topic.layout.merge_segments(
                ordered[i].segment_id, ordered[i + 1].segment_id
            )


def read(topic: Topic, start: StreamPosition, end: StreamPosition) -> list[list[tuple[int, int]]]:
    ranges = ranges_between(start, end, topic.offsets())
    return [topic.records[r.segment_id][r.start : r.end] for r in ranges]


ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("produce"), st.integers(0, 30)),
        st.tuples(st.just("split"), st.integers(0, 100)),
        st.tuples(st.just("merge"), st.integers(0, 100)),
        st.tuples(st.just("batch"), st.one_of(st.none(), st.integers(1, 7))),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(segments=st.integers(1, 4), actions=ACTIONS)
def test_batches_hold_every_record_once_and_each_key_in_order(
    segments: int, actions: list[tuple[str, int | None]]
) -> None:
    topic = Topic(segments)
    position = initial_position("t", "i1", topic.layout, topic.offsets(), "earliest")
    batches: list[list[tuple[int, int]]] = []

    def plan(limit: int | None) -> None:
        nonlocal position
        layout, offsets = topic.layout, topic.offsets()  # the layout is read first
        end = next_position(position, layout, offsets, max_messages=limit).position
        ranges = read(topic, position, end)
        got = [r for records in ranges for r in records]
        assert limit is None or len(got) <= limit
        # Spark reads a batch's ranges in parallel: a key in two of them has no order
        for key in {k for k, _ in got}:
            assert sum(any(k == key for k, _ in records) for records in ranges) == 1, key
        batches.append(got)
        position = end

    for action, arg in actions:
        if action == "batch":
            plan(arg)
        else:
            apply(topic, [(action, arg)])
    for _ in range(200):  # drain: every batch makes progress until nothing is left
        plan(None)
    seen = [r for batch in batches for r in batch]
    assert sorted(seen) == sorted((k, n) for k, count in topic.sent.items() for n in range(count))
    last_of_key: dict[int, int] = {}
    for key, sequence in seen:  # batches in order, and within a batch each segment in order
        assert last_of_key.get(key, -1) == sequence - 1, (key, sequence)
        last_of_key[key] = sequence


def test_a_child_is_read_only_in_a_batch_after_its_parents_finished() -> None:
    topic = Topic(1)
    for key in range(10):
        topic.produce(key)
    start = initial_position("t", "i1", topic.layout, topic.offsets(), "earliest")
    topic.layout = topic.layout.split_segment(0)
    for key in range(10):
        topic.produce(key)
    first = next_position(start, topic.layout, topic.offsets()).position
    assert [r.segment_id for r in ranges_between(start, first, topic.offsets())] == [0]
    assert first.finished == {0}
    second = next_position(first, topic.layout, topic.offsets()).position
    assert {r.segment_id for r in ranges_between(first, second, topic.offsets())} <= {1, 2}
    assert sum(r.end - r.start for r in ranges_between(first, second, topic.offsets())) == 10


def test_latest_starts_after_what_exists_and_json_offsets_count_ancestors_as_read() -> None:
    topic = Topic(2)
    for key in range(20):
        topic.produce(key)
    topic.layout = topic.layout.split_segment(0)  # 0 → 2, 3
    latest = initial_position("t", "i1", topic.layout, topic.offsets(), "latest")
    assert latest.finished == {0} and latest.next == {1: len(topic.records[1]), 2: 0, 3: 0}
    chosen = initial_position("t", "i1", topic.layout, topic.offsets(), {2: 0, 1: LATEST})
    assert chosen.finished == {0} and chosen.next == {1: len(topic.records[1]), 2: 0, 3: 0}
    everything = initial_position("t", "i1", topic.layout, topic.offsets(), {1: EARLIEST})
    assert everything.next[0] == 0 and not everything.finished


def test_a_batch_counts_its_records_what_it_left_and_what_each_segment_holds_past_it() -> None:
    topic = Topic(1)
    for key in range(10):
        topic.produce(key)
    start = initial_position("t", "i1", topic.layout, topic.offsets(), "earliest")
    topic.layout = topic.layout.split_segment(0)  # 0 → 1, 2
    for key in range(10):
        topic.produce(key)
    children = {s: len(topic.records[s]) for s in (1, 2)}
    topic.start[0] = 2  # retention deleted two records nobody read yet
    assert behind(start, topic.offsets()) == {0: 8, **children}

    lossy = {"fail_on_data_loss": False}
    capped = next_position(start, topic.layout, topic.offsets(), max_messages=3, **lossy)
    assert (capped.records, capped.segments, capped.available) == (3, 1, 8)
    assert behind(capped.position, topic.offsets()) == {0: 5, **children}
    whole = next_position(start, topic.layout, topic.offsets(), **lossy)
    assert (whole.records, whole.available) == (8, 8)
    assert behind(whole.position, topic.offsets()) == children  # 0 finished: not listed
    last = next_position(whole.position, topic.layout, topic.offsets())
    assert (last.records, last.segments, last.available) == (10, 2, 10)
    assert behind(last.position, topic.offsets()) == {1: 0, 2: 0}


def test_a_byte_cap_buys_records_at_their_mean_stored_size_and_at_least_one() -> None:
    topic = Topic(2)
    for key in range(40):
        topic.produce(key)
    start = initial_position("t", "i1", topic.layout, topic.offsets(), "earliest")
    sized = {
        s: SegmentOffsets(o.start, o.end, 100 * (o.end - o.start))
        for s, o in topic.offsets().items()
    }

    def records(**caps: int) -> int:
        return next_position(start, topic.layout, sized, **caps).records

    assert records(max_bytes=1_050) == 10  # 100 bytes a record
    assert records(max_bytes=50) == 1  # a record larger than the cap is still read
    assert records(max_bytes=1_050, max_messages=4) == 4  # the smaller cap wins
    assert records(max_bytes=10**9) == 40
    unsized = next_position(start, topic.layout, topic.offsets(), max_bytes=50)
    assert unsized.records == 40  # no sizes known: nothing to go by


@pytest.mark.parametrize(
    ("starting", "error", "message"),
    [
        ("middle", InvalidArgumentError, "'earliest', 'latest' or a JSON object"),
        ({7: 0}, SegmentNotFoundError, "names segments [7]"),
        ({1: 99}, ConflictError, "holds offsets 0 to 0, not 99"),
    ],
)
def test_bad_starting_offsets_say_what_is_allowed(
    starting: object, error: type[ScalableTopicsError], message: str
) -> None:
    topic = Topic(2)
    with pytest.raises(error, match=message.replace("[", r"\[")):
        initial_position("t", "i1", topic.layout, topic.offsets(), starting)  # type: ignore[arg-type]


def test_data_deleted_before_it_was_read_fails_or_is_skipped_with_a_warning() -> None:
    topic = Topic(1)
    for key in range(10):
        topic.produce(key)
    start = initial_position("t", "i1", topic.layout, topic.offsets(), "earliest")
    topic.start[0] = 4  # retention deleted offsets 0-3 before the query read them
    with pytest.raises(UnavailableSegmentsError, match=r"no longer holds offsets 0 to 3"):
        next_position(start, topic.layout, topic.offsets())
    plan = next_position(start, topic.layout, topic.offsets(), fail_on_data_loss=False)
    assert plan.position.next == {0: 10} and "skipped" in plan.warnings[0]
    missing = dict(topic.offsets())
    del missing[0]
    with pytest.raises(UnavailableSegmentsError, match="segment 0 did not answer"):
        next_position(start, topic.layout, missing)
    skipped = next_position(start, topic.layout, missing, fail_on_data_loss=False)
    assert skipped.position.finished == {0} and "did not answer: skipped" in skipped.warnings[0]


def test_available_now_reads_what_every_segment_held_when_it_began_children_included() -> None:
    topic = Topic(1)
    for key in range(5):
        topic.produce(key)
    start = initial_position("t", "i1", topic.layout, topic.offsets(), "earliest")
    topic.layout = topic.layout.split_segment(0)
    for key in range(5):
        topic.produce(key)  # into the children, before the run began
    until = initial_position("t", "i1", topic.layout, topic.offsets(), "latest")
    for key in range(5):
        topic.produce(key)  # after it began: not for this run
    topic.layout = topic.layout.split_segment(1)
    for key in range(5):
        topic.produce(key)
    read = 0
    for _ in range(10):
        end = next_position(start, topic.layout, topic.offsets(), until=until).position
        read += sum(r.end - r.start for r in ranges_between(start, end, topic.offsets()))
        if end == start:
            break
        start = end
    assert read == 10


def test_positions_round_trip_and_bad_ones_are_refused() -> None:
    position = StreamPosition("t", "i1", {3: 7, 10: 0}, frozenset({0, 1}))
    assert StreamPosition.from_dict(position.to_dict()) == position
    assert position.to_json() == (
        '{"topic":"t","incarnation":"i1","next":{"3":7,"10":0},"finished":[0,1]}'
    )
    for bad in (
        {"topic": "t"},
        {**position.to_dict(), "next": {"x": 1}},
        {**position.to_dict(), "next": {"3": -1}},
        [],
    ):
        with pytest.raises(InvalidArgumentError, match="not a stream position"):
            StreamPosition.from_dict(bad)
    with pytest.raises(InconsistentRequestError, match="both read and finished"):
        StreamPosition.from_dict({**position.to_dict(), "next": {"0": 1}})
    other = StreamPosition("t", "i2")
    with pytest.raises(InconsistentRequestError, match="different topics or incarnations"):
        ranges_between(position, other, {})
    past = StreamPosition("t", "i1", {0: 50})
    with pytest.raises(ConflictError, match="past the end of segment 0"):
        next_position(past, SegmentLayout.initial(1), {0: SegmentOffsets(0, 10)})


# --- snapshots (what read_topic and Ray Data plan) --------------------------------------


def snapshot(
    topic: Topic, start: StreamPosition | None, end: StreamPosition | None, later: list
) -> tuple[list[tuple[int, int]], StreamPosition]:
    """A snapshot planned as the cluster plans one: the layout read first, then ``later``
    happens (produces, splits, merges), then the listed segments are asked their offsets."""
    layout = topic.layout
    wanted = snapshot_segments(layout, start, end)
    apply(topic, later)
    offsets = {s: held for s, held in topic.offsets().items() if s in wanted}
    first = start or initial_position("t", "i1", layout, offsets, "earliest")
    last = end or snapshot_end(first, layout, offsets)
    ranges = snapshot_ranges(first, end, layout, offsets)
    return [r for x in ranges for r in topic.records[x.segment_id][x.start : x.end]], last


LAYOUT_ACTIONS = st.lists(
    st.tuples(st.sampled_from(["produce", "produce", "split", "merge"]), st.integers(0, 100)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    segments=st.integers(1, 4),
    before=LAYOUT_ACTIONS,
    during=LAYOUT_ACTIONS,
    between=LAYOUT_ACTIONS,
    during_second=LAYOUT_ACTIONS,
)
def test_snapshots_hold_a_prefix_of_every_key_and_chain_without_gaps_or_overlaps(
    segments: int,
    before: list[tuple[str, int]],
    during: list[tuple[str, int]],
    between: list[tuple[str, int]],
    during_second: list[tuple[str, int]],
) -> None:
    """A snapshot holds everything produced before it was planned, each key's records a
    prefix of its history, whatever splits and merges race its planning; the next
    snapshot from where it ended holds the rest once."""
    topic = Topic(segments)
    apply(topic, before)
    produced_before = {(k, n) for k, count in topic.sent.items() for n in range(count)}
    first, end = snapshot(topic, None, None, during)
    assert len(first) == len(set(first))
    assert produced_before <= set(first)
    for key in {k for k, _ in first}:
        sequences = sorted(n for k, n in first if k == key)
        assert sequences == list(range(len(sequences))), key
    apply(topic, between)
    second, _ = snapshot(topic, end, None, during_second)
    assert not set(first) & set(second)
    every = {(k, n) for k, count in topic.sent.items() for n in range(count)}
    assert set(first) | set(second) <= every
    settled, _ = snapshot(topic, end, None, [])  # nothing racing: all of the rest
    assert set(first) | set(settled) == every


def test_snapshot_bounds_and_what_retention_deleted() -> None:
    topic = Topic(2)
    for key in range(40):
        topic.produce(key)
    counts = {s: len(topic.records[s]) for s in (0, 1)}
    middle = StreamPosition("t", "i1", {0: 3, 1: 4})
    assert snapshot_segments(topic.layout, middle, StreamPosition("t", "i1", {0: 3})) == []
    read, _ = snapshot(topic, None, middle, [])
    assert len(read) == 7
    topic.start[0] = 5  # retention deleted offsets 0 to 4: a snapshot reads what is held
    ranges = snapshot_ranges(middle, None, topic.layout, topic.offsets())
    assert [(r.segment_id, r.start, r.end) for r in ranges] == [
        (0, 5, counts[0]),
        (1, 4, counts[1]),
    ]
    with pytest.raises(ConflictError, match=r"past the end of segments \[1\]"):
        snapshot_ranges(
            StreamPosition("t", "i1", {1: counts[1] + 1}), None, topic.layout, topic.offsets()
        )
    silent = {1: topic.offsets()[1]}  # segment 0 did not answer: no range, it is missing
    assert [r.segment_id for r in snapshot_ranges(middle, None, topic.layout, silent)] == [1]
    assert [
        r.segment_id
        for r in snapshot_ranges(StreamPosition("t", "i1"), middle, topic.layout, silent)
    ] == [1]
    topic.layout = topic.layout.split_segment(0)
    done = StreamPosition("t", "i1", {}, frozenset({0}))
    assert snapshot_segments(topic.layout, done, None) == [1, 2, 3]
