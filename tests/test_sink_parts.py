"""The streaming sink's parts (``runtime.sink_parts``), without Ray: a write carried out
as ``actors.admin.stream_writes`` does, while the topic splits and merges and the writer
crashes and replays at any step, stores every record exactly once, in a segment that
owned its hash when it was stored, and never reuses a sequence on a segment."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.layout import HashRange, SegmentLayout
from runtime.names import MAX_HASH
from runtime.sink_parts import (
    WHOLE,
    SinkPart,
    in_append_order,
    owned_pieces,
    with_sequences,
)


class Segments:
    """What each segment stored for one producer: sequences and record positions."""

    def __init__(self) -> None:
        self.sequences: dict[int, list[int]] = defaultdict(list)
        self.rows: dict[int, list[int]] = defaultdict(list)

    def last(self, segment_id: int) -> int:
        return max(self.sequences[segment_id], default=-1)

    def lasts(self, segment_ids: set[int]) -> dict[int, int]:
        return {s: self.last(s) for s in segment_ids}


class Writer:
    """The carry-out loop of ``actors.admin.stream_writes._Write`` over a simulated topic."""

    def __init__(self, layout: SegmentLayout, hashes: np.ndarray, stored: Segments) -> None:
        self.layout, self.hashes, self.stored = layout, hashes, stored
        pieces = owned_pieces(layout, hashes)
        self.recorded = with_sequences(pieces, stored.lasts({s for s, _ in pieces}))
        self.pending = in_append_order(self.recorded)
        self.resumed = False

    def crash(self) -> None:
        self.pending, self.resumed = in_append_order(self.recorded), True

    def step(self) -> None:
        part = self.pending.pop(0)
        rows = part.rows(self.hashes)
        if self.resumed and self.stored.last(part.segment) >= part.sequence:
            return
        if not self.layout.get(part.segment).is_active:  # the segment refuses it whole
            kept = [p for p in self.recorded if p != part]
            pieces = owned_pieces(self.layout, self.hashes, part.hash_range)
            moved = with_sequences(pieces, self.stored.lasts({s for s, _ in pieces}), kept)
            self.recorded = [*kept, *moved]
            self.pending = in_append_order([*self.pending, *moved])
            return
        assert part.sequence > self.stored.last(part.segment), "a sequence reused or reordered"
        self.stored.sequences[part.segment].append(part.sequence)
        self.stored.rows[part.segment] += rows.tolist()


def reshape(layout: SegmentLayout, choice: int) -> SegmentLayout:
    """A split (even ``choice``) or a merge of neighbours (odd), picked by ``choice``."""
    active = sorted(layout.active_segments.values(), key=lambda s: s.hash_range.start)
    if choice % 2 == 0 or len(active) == 1:
        target = active[choice // 2 % len(active)]
        return layout if target.hash_range.width < 2 else layout.split_segment(target.segment_id)
    left = choice // 2 % (len(active) - 1)
    return layout.merge_segments(active[left].segment_id, active[left + 1].segment_id)


@settings(max_examples=300, deadline=None)
@given(
    segments=st.integers(1, 4),
    hashes=st.lists(st.integers(0, MAX_HASH), min_size=1, max_size=40),
    actions=st.lists(st.tuples(st.sampled_from(["step", "reshape", "crash"]), st.integers(0, 50))),
)
def test_a_write_stores_each_record_once_whatever_the_layout_and_crashes_do(
    segments: int, hashes: list[int], actions: list[tuple[str, int]]
) -> None:
    layout = SegmentLayout.initial(segments)
    stored = Segments()
    writer = Writer(layout, np.array(hashes, dtype=np.int64), stored)
    for action, choice in actions:
        if action == "reshape":
            writer.layout = reshape(writer.layout, choice)
        elif action == "crash":
            writer.crash()
        elif writer.pending:
            writer.step()
    writer.crash()  # and a final replay that runs to the end
    while writer.pending:
        writer.step()
    placed = sorted(row for rows in stored.rows.values() for row in rows)
    assert placed == list(range(len(hashes)))
    for segment_id, rows in stored.rows.items():
        span = writer.layout.get(segment_id).hash_range
        assert all(hashes[row] in span for row in rows)


def test_pieces_cover_only_segments_that_get_records_and_only_the_given_range() -> None:
    layout = SegmentLayout.initial(4)  # quarters of the hash space
    quarter = (MAX_HASH + 1) // 4
    hashes = np.array([5, quarter + 5, quarter + 9])
    assert owned_pieces(layout, hashes) == [
        (0, layout.get(0).hash_range),
        (1, layout.get(1).hash_range),
    ]
    span = HashRange(start=quarter + 6, end=MAX_HASH)
    assert owned_pieces(layout, hashes, span) == [
        (1, HashRange(start=quarter + 6, end=2 * quarter - 1))
    ]
    assert owned_pieces(layout, np.array([], dtype=np.int64), WHOLE) == []


def test_sequences_follow_both_the_segment_and_the_parts_the_write_holds_there() -> None:
    half = HashRange(start=0, end=10)
    held = [SinkPart(segment=7, sequence=4, hash_range=half)]
    parts = with_sequences([(7, half), (7, half), (8, half)], {7: 1, 8: 9}, held)
    assert [(p.segment, p.sequence) for p in parts] == [(7, 5), (7, 6), (8, 10)]
    shuffled = [parts[2], parts[1], held[0], parts[0]]
    assert [(p.segment, p.sequence) for p in in_append_order(shuffled)] == [
        (7, 4),
        (7, 5),
        (7, 6),
        (8, 10),
    ]
