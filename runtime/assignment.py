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
* With more consumers than readable segments (a stream subscription's key-shared
  mode), segments are cut into *shares*: contiguous runs of a segment's key buckets
  (``runtime.hashing.key_buckets``), one share per consumer, each segment in as equal
  parts as the budget allows, so every consumer reads and every key stays with one
  consumer. A consumer keeps the very share it held when it is still wanted, else
  one overlapping what it held.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from runtime.layout import SegmentInfo, SegmentLayout


class Share(NamedTuple):
    """A consumer's part of a segment: buckets ``[start, end)`` of ``count``; a whole
    segment has ``count`` 0 (it holds every bucket, whatever the budget)."""

    segment_id: int
    start: int = 0
    end: int = 0
    count: int = 0

    @property
    def whole(self) -> bool:
        return self.count == 0

    def overlaps(self, other: Share) -> bool:
        """Whether a key could belong to both: same segment, and buckets in common (a
        whole segment, or a different budget, counts as overlapping everything)."""
        if self.segment_id != other.segment_id:
            return False
        if self.whole or other.whole or self.count != other.count:
            return True
        return self.start < other.end and other.start < self.end

    def to_dict(self) -> dict[str, int]:
        return {"start": self.start, "end": self.end, "count": self.count}


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


def assign_shares(
    readable: list[SegmentInfo],
    consumers: Iterable[str],
    current: Mapping[Share, str],
    buckets: int,
) -> dict[Share, str]:
    """Desired owner of every share of the readable segments: whole segments by
    ``assign`` while the consumers are no more than the segments (or ``buckets`` is 1),
    else every consumer one share, at most ``buckets`` shares a segment."""
    names = sorted(set(consumers))
    if len(names) <= len(readable) or buckets <= 1:
        held: dict[int, str] = {}
        for share, owner in sorted(current.items()):
            held.setdefault(share.segment_id, owner)  # a split segment's first share's
        return {Share(s): c for s, c in assign(readable, names, held).items()}
    wanted = [
        Share(info.segment_id, part * buckets // parts, (part + 1) * buckets // parts, buckets)
        if parts > 1
        else Share(info.segment_id)
        for info, parts in _parts(readable, len(names), buckets)
        for part in range(parts)
    ]
    owners: dict[Share, str] = {}
    free = set(names)
    for share in wanted:  # the very share it holds
        owner = current.get(share)
        if owner in free:
            owners[share] = owner
            free.discard(owner)
    for share in wanted:  # a consumer that held part of these buckets (or a parent)
        if share in owners:
            continue
        near = sorted(
            c
            for s, c in current.items()
            if c in free and (s.overlaps(share) or _parent(s, share, readable))
        )
        owner = near[0] if near else min(free, default=None)
        if owner is not None:
            owners[share] = owner
            free.discard(owner)
    return owners


def _parts(
    readable: list[SegmentInfo], consumers: int, buckets: int
) -> list[tuple[SegmentInfo, int]]:
    """How many shares each segment is cut into: the consumers spread as evenly as the
    segments allow, the widest segments taking the remainder, none above ``buckets``."""
    base, extra = divmod(consumers, len(readable))
    widest = sorted(readable, key=lambda i: (-i.hash_range.width, i.hash_range.start))[:extra]
    more = {info.segment_id for info in widest}
    return [(info, min(base + (info.segment_id in more), buckets)) for info in readable]


def _parent(held: Share, share: Share, readable: list[SegmentInfo]) -> bool:
    """Whether ``held`` is of a parent of ``share``'s segment."""
    info = next(i for i in readable if i.segment_id == share.segment_id)
    return held.segment_id in info.parent_ids
