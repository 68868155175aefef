"""An idempotent write's parts (``runtime.sink_parts``): which segments get which hash
ranges, under which sequences. The whole write, with splits, merges and crashes at any
step, is ``tests/test_sink_writes.py``."""

from __future__ import annotations

import numpy as np

from runtime.layout import HashRange, SegmentLayout
from runtime.names import MAX_HASH
from runtime.sink_parts import (
    WHOLE,
    SinkPart,
    in_append_order,
    owned_pieces,
    with_sequences,
)


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
