"""What a stream subscription's reader of one share gets out of the records it looked at.

A share (``runtime.assignment.Share``) is a whole segment or a run of its key buckets.
Its reader reads from where it stands, and the segment answers with the records of
its buckets that the subscription has not acknowledged (acknowledgements above the
cumulative one are individual: a shared segment's readers acknowledge their own
offsets, and a bucket's next owner must not get again what its last one settled).
Pure, so the rules are tested without a segment.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from runtime.hashing import key_buckets


def of_share(
    scanned: pa.RecordBatch,
    acked: Iterable[tuple[int, int]],
    buckets: tuple[int, int, int],
) -> pa.RecordBatch:
    """The rows of ``scanned`` (a delivery batch) outside the ``acked`` offset ranges
    (half-open) whose key falls in buckets ``[start, end)`` of ``count`` (``count`` 0:
    every key)."""
    if scanned.num_rows == 0:
        return scanned
    offsets = scanned.column("offset").to_numpy()
    first_offset, following = int(offsets[0]), int(offsets[-1]) + 1
    keep = np.ones(len(offsets), dtype=bool)
    for first, end in acked:
        if first < following and end > first_offset:
            keep &= (offsets < first) | (offsets >= end)
    start, end, count = buckets
    if count:
        bucket = key_buckets(scanned.column("key"), count, offsets)
        keep &= (bucket >= start) & (bucket < end)
    return scanned if keep.all() else scanned.filter(pa.array(keep))
