"""Message routing: which active segment each message belongs to, for whole columns.

Routing is a binary search of each key's hash among the active segments'
range starts, done for a whole column with NumPy, and grouping keeps each
segment's messages in their original order (a stable sort), because per-key
order is the promise the whole system exists to keep.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.layout import SegmentLayout


@dataclass(frozen=True)
class Partition:
    """Row indices per segment id, each in original order."""

    groups: dict[int, np.ndarray]


def partition(layout: SegmentLayout, hashes: np.ndarray, unkeyed_segment: int) -> Partition:
    """Group rows by segment; rows with hash -1 (no key) go to ``unkeyed_segment``."""
    active = list(layout.active_segments.values())
    starts = np.fromiter((s.hash_range.start for s in active), dtype=np.int64, count=len(active))
    ids = np.fromiter((s.segment_id for s in active), dtype=np.int64, count=len(active))
    index = np.searchsorted(starts, hashes, side="right") - 1
    targets = ids[np.clip(index, 0, len(ids) - 1)]
    targets[hashes < 0] = unkeyed_segment
    order = np.argsort(targets, kind="stable")
    sorted_targets = targets[order]
    if not len(order):
        return Partition({})
    cuts = np.flatnonzero(np.diff(sorted_targets)) + 1
    firsts = np.concatenate([[0], cuts])
    pieces = np.split(order, cuts)
    return Partition({int(sorted_targets[f]): p for f, p in zip(firsts, pieces, strict=True)})
