"""Which consumer reads which segment: readability in DAG order, sticky balancing.

Pure functions, so every rule is property-tested without Ray:

* A segment is *readable* for a subscription once every parent still in the
  DAG is finished for it (sealed and read to its end); a finished segment is
  no longer assigned. A sealed segment with backlog stays readable until
  finished — it is never dropped just because it is no longer ACTIVE.
* Assignment is deterministic and sticky: a segment keeps its owner while
  that owner is present and the load stays balanced (max - min <= 1); a new
  segment prefers the owner of one of its parents (so a split stays on the
  consumer that drained the parent); only the minimum number of segments move.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from runtime.layout import SegmentInfo, SegmentLayout


def readable_segments(layout: SegmentLayout, finished: Iterable[int]) -> list[SegmentInfo]:
    """``SegmentLayout.readable``, by hash start."""
    return sorted(
        layout.readable(finished), key=lambda info: (info.hash_range.start, info.segment_id)
    )


def assign(
    readable: list[SegmentInfo], consumers: Iterable[str], current: Mapping[int, str]
) -> dict[int, str]:
    """Desired owner of every readable segment (empty when there are no consumers)."""
    names = sorted(set(consumers))
    if not names:
        return {}
    owners: dict[int, str] = {}
    load = {name: 0 for name in names}
    quota = -(-len(readable) // len(names))  # ceil
    for info in readable:
        owner = current.get(info.segment_id)
        if owner in load and load[owner] < quota:
            owners[info.segment_id] = owner
            load[owner] += 1
    for info in readable:
        if info.segment_id not in owners:
            owner = _preferred(info, current, load, quota) or _least_loaded(load)
            owners[info.segment_id] = owner
            load[owner] += 1
    _balance(owners, load)
    return owners


def _preferred(
    info: SegmentInfo, current: Mapping[int, str], load: dict[str, int], quota: int
) -> str | None:
    """The owner of one of the segment's parents, if it has room."""
    for parent in sorted(info.parent_ids):
        owner = current.get(parent)
        if owner in load and load[owner] < quota:
            return owner
    return None


def _least_loaded(load: dict[str, int]) -> str:
    return min(load, key=lambda name: (load[name], name))


def _balance(owners: dict[int, str], load: dict[str, int]) -> None:
    """Move segments from the most to the least loaded consumer until max - min <= 1."""
    while True:
        heavy = max(load, key=lambda name: (load[name], name))
        light = _least_loaded(load)
        if load[heavy] - load[light] <= 1:
            return
        moved = max(seg for seg, owner in owners.items() if owner == heavy)
        owners[moved] = light
        load[heavy] -= 1
        load[light] += 1
