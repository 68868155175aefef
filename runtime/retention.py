"""Which sealed segments retention may prune from the DAG: a pure choice.

A sealed segment goes once every subscription has drained it and its newest
data is older than the retention time. Only roots can be pruned (see
``SegmentLayout.prune_segment``), and since segment ids grow along the DAG
(children always get larger ids than their parents), one pass in id order
finds every segment that becomes a root once its pruned ancestors are gone.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.layout import SegmentLayout
from runtime.policy import RetentionPolicy


@dataclass(frozen=True)
class SealedSegmentState:
    """What the segment itself reports: sealed, drained by all cursors, newest publish time."""

    terminated: bool
    drained: bool
    last_publish_ms: int | None


def prunable(
    layout: SegmentLayout,
    states: dict[int, SealedSegmentState],
    retention: RetentionPolicy,
    now_ms: int,
) -> list[int]:
    """Ids to prune, in an order where each is a root once those before it are gone.

    A segment without a reported state is kept: not knowing is no reason to delete.
    """
    keep_ms = (retention.time_s or 0.0) * 1000.0
    pruned: list[int] = []
    gone: set[int] = set()
    for segment in layout.all_segments.values():  # ascending ids: parents first
        state = states.get(segment.segment_id)
        if segment.is_active or state is None or not (state.terminated and state.drained):
            continue
        if any(p in layout.all_segments and p not in gone for p in segment.parent_ids):
            continue
        newest = state.last_publish_ms
        if newest is not None and now_ms - newest < keep_ms:
            continue
        gone.add(segment.segment_id)
        pruned.append(segment.segment_id)
    return pruned
