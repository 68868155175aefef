"""A share's reader gets its buckets' unacknowledged records (``runtime.share_reads``)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.batch import DELIVERY_SCHEMA
from runtime.share_reads import of_share

keys = st.lists(st.one_of(st.none(), st.sampled_from([f"k{i}" for i in range(40)])), max_size=80)
ranges = st.lists(st.tuples(st.integers(0, 120), st.integers(1, 20)), max_size=6)


def delivery(batch_keys: list[str | None], base: int) -> pa.RecordBatch:
    n = len(batch_keys)
    return pa.RecordBatch.from_pydict(
        {
            "key": batch_keys,
            "value": [b"v"] * n,
            "properties": [None] * n,
            "offset": list(range(base, base + n)),
            "publish_time": [0] * n,
        },
        schema=DELIVERY_SCHEMA,
    )


@settings(deadline=None)
@given(keys, st.integers(0, 50), ranges, st.integers(1, 7), st.sampled_from([1, 4, 256]))
def test_the_parts_of_a_segment_read_each_unacknowledged_record_once(
    batch_keys: list[str | None], base: int, acked: list[tuple[int, int]], parts: int, count: int
) -> None:
    parts = min(parts, count)
    scanned = delivery(batch_keys, base)
    acked_ranges = [(first, first + width) for first, width in acked]
    cuts = [(p * count // parts, (p + 1) * count // parts, count) for p in range(parts)]
    got = [of_share(scanned, acked_ranges, cut).column("offset").to_pylist() for cut in cuts]
    flat = [o for offsets in got for o in offsets]
    unacked = [
        o
        for o in range(base, base + len(batch_keys))
        if not any(first <= o < end for first, end in acked_ranges)
    ]
    assert sorted(flat) == unacked  # every one once: no part misses one, none shares one
    assert all(offsets == sorted(offsets) for offsets in got)  # in offset order
    whole = of_share(scanned, acked_ranges, (0, 0, 0)).column("offset").to_pylist()
    assert whole == unacked
    # a key stays in one part
    owner = {}
    for part, offsets in enumerate(got):
        for offset in offsets:
            key = batch_keys[offset - base]
            if key is not None:
                assert owner.setdefault(key, part) == part
