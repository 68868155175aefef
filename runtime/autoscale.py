"""Automatic split/merge decisions: pure functions over measured segment rates.

The controller samples every active segment's end offset and size, feeds the
samples to a ``LoadTracker`` and asks ``decide`` what to do. Flapping is ruled
out three ways: a segment's rate only counts once it spans a whole window (a
new child must prove its load first); nothing happens within the cool-down
after any change; and the merge threshold sits ``scale_factor`` below the
split threshold, so a split's halves (together above target) never qualify
for a merge and a merged segment (below target / factor) never for a split.

Stream consumers are the other reason to split: with more of them on a
subscription than active segments, the busiest segment splits when its load is
at least the policy's consumer threshold (held at ``1 / scale_factor`` or above, so
the same hysteresis holds); below it the decision is a *re-bucket*: the layout
stays and the consumers share segments by key bucket (``runtime.assignment``).
A cap on merges per lineage keeps a range from merging again and again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from runtime.layout import SegmentInfo, SegmentLayout
from runtime.policy import AutoscalePolicy


@dataclass(frozen=True)
class Rate:
    msgs_per_s: float
    bytes_per_s: float
    out_msgs_per_s: float = 0.0  # acknowledged, summed over the subscriptions

    def load(self, policy: AutoscalePolicy) -> float:
        """Fraction of one segment's target (1.0 = exactly at target)."""
        loads = [0.0]
        if policy.target_msgs_per_s:
            loads.append(self.msgs_per_s / policy.target_msgs_per_s)
        if policy.target_bytes_per_s:
            loads.append(self.bytes_per_s / policy.target_bytes_per_s)
        if policy.target_output_msgs_per_s:
            loads.append(self.out_msgs_per_s / policy.target_output_msgs_per_s)
        return max(loads)


@dataclass(frozen=True)
class Decision:
    """``rebucket``: consumers outnumber segments, none busy enough to split; the layout
    stays and they share segments by key bucket."""

    kind: Literal["split", "merge", "rebucket"]
    segment_ids: tuple[int, ...]
    reason: str


class LoadTracker:
    """Recent (time, records, bytes) samples per segment; rates over a window."""

    def __init__(self) -> None:
        self._samples: dict[int, deque[tuple[float, int, int, int]]] = {}

    def observe(self, now: float, totals: dict[int, tuple[int, ...]]) -> None:
        """Record ``{segment_id: (records, bytes[, acknowledged])}``, acknowledged summed
        over the subscriptions; forget segments no longer reported."""
        for gone in set(self._samples) - set(totals):
            del self._samples[gone]
        for segment_id, (records, nbytes, *acked) in totals.items():
            sample = (now, records, nbytes, acked[0] if acked else 0)
            self._samples.setdefault(segment_id, deque(maxlen=256)).append(sample)

    def rates(self, now: float, window_s: float) -> dict[int, Rate]:
        """Average rate over the last ``window_s`` for segments observed at least that long."""
        result = {}
        for segment_id, samples in self._samples.items():
            first = _oldest_within(samples, now - window_s)
            t1, r1, b1, a1 = samples[-1]
            if first is None or t1 - first[0] <= 0:
                continue
            span = t1 - first[0]
            result[segment_id] = Rate(
                (r1 - first[1]) / span, max(b1 - first[2], 0) / span, max(a1 - first[3], 0) / span
            )
        return result


class AckCounter:
    """Messages acknowledged per segment, summed over its subscriptions, as a running
    count for ``LoadTracker``: each round adds how far each subscription's cursor moved
    since the last round. A subscription seen for the first time adds nothing (one
    created at the end of the log did not read all of it), and one that was reset
    backwards or deleted takes nothing away."""

    def __init__(self) -> None:
        self._cursors: dict[int, dict[str, int]] = {}
        self._totals: dict[int, int] = {}

    def observe(self, cursors: dict[int, dict[str, int]]) -> dict[int, int]:
        """``{segment_id: {subscription: cursor}}`` now; the running counts."""
        for gone in set(self._cursors) - set(cursors):
            del self._cursors[gone]
            self._totals.pop(gone, None)
        for segment_id, now in cursors.items():
            before = self._cursors.get(segment_id, {})
            moved = sum(max(at - before[sub], 0) for sub, at in now.items() if sub in before)
            self._totals[segment_id] = self._totals.get(segment_id, 0) + moved
            self._cursors[segment_id] = dict(now)
        return dict(self._totals)


def _oldest_within(samples: deque, since: float) -> tuple[float, int, int, int] | None:
    """The newest sample taken at or before ``since``: the window's start, if covered."""
    start = None
    for sample in samples:
        if sample[0] > since:
            break
        start = sample
    return start


def decide(
    policy: AutoscalePolicy,
    layout: SegmentLayout,
    rates: dict[int, Rate],
    now: float,
    last_change_at: float | None,
    consumers: int = 0,
) -> Decision | None:
    """At most one layout change for this round, or None. ``consumers``: the most stream
    consumers one of the topic's subscriptions has."""
    if last_change_at is not None and now - last_change_at < policy.cooldown_s:
        return None
    active = list(layout.active_segments.values())  # in hash-range order
    if len(active) < policy.min_segments:
        widest = max(active, key=lambda s: s.hash_range.width)
        if widest.hash_range.width > 1:
            return Decision("split", (widest.segment_id,), "below minSegments")
    if len(active) > policy.max_segments:
        return _coldest_pair(layout, active, rates, policy, "above maxSegments", require_cold=False)
    if any(s.segment_id not in rates for s in active):
        return None  # a segment has not been watched for a whole window yet
    if len(active) < policy.max_segments:
        hot = [s for s in active if s.hash_range.width > 1 and rates[s.segment_id].load(policy) > 1]
        if hot:
            hottest = max(hot, key=lambda s: rates[s.segment_id].load(policy))
            load = rates[hottest.segment_id].load(policy)
            return Decision("split", (hottest.segment_id,), f"load {load:.2f} x target")
    if consumers > len(active):
        return _for_consumers(active, rates, policy, consumers)
    if len(active) > policy.min_segments:
        return _coldest_pair(layout, active, rates, policy, "cold neighbours", require_cold=True)
    return None


def consumer_split_threshold(policy: AutoscalePolicy) -> float:
    """The load at which a segment splits for consumers: never below where two segments
    merge, so neither undoes the other."""
    return max(policy.consumer_split_load, 1 / policy.scale_factor)


def _for_consumers(
    active: list[SegmentInfo], rates: dict[int, Rate], policy: AutoscalePolicy, consumers: int
) -> Decision:
    """More stream consumers than segments: split the busiest if it carries real load
    (and the layout may grow), else share by key bucket."""
    splittable = [s for s in active if s.hash_range.width > 1]
    busiest = max(splittable, key=lambda s: rates[s.segment_id].load(policy), default=None)
    why = f"{consumers} stream consumers on {len(active)} segments"
    if busiest is not None and len(active) < policy.max_segments:
        load = rates[busiest.segment_id].load(policy)
        if load >= consumer_split_threshold(policy):
            return Decision("split", (busiest.segment_id,), f"{why}, busiest at load {load:.2f}")
    return Decision("rebucket", (), f"{why}: shared by key bucket")


def lineage_merges(layout: SegmentLayout, segment_id: int) -> int:
    """The merges in a segment's ancestry as far as the layout still holds it (a merge
    is a segment of several parents): the most along any line."""
    info = layout.all_segments.get(segment_id)
    if info is None:
        return 0
    above = max((lineage_merges(layout, p) for p in info.parent_ids), default=0)
    return above + (len(info.parent_ids) > 1)


def _coldest_pair(
    layout: SegmentLayout,
    active: list[SegmentInfo],
    rates: dict[int, Rate],
    policy: AutoscalePolicy,
    reason: str,
    *,
    require_cold: bool,
) -> Decision | None:
    def load(segment: SegmentInfo) -> float:
        rate = rates.get(segment.segment_id)
        return rate.load(policy) if rate is not None else float("inf")

    def capped(a: SegmentInfo, b: SegmentInfo) -> bool:
        cap = policy.max_merges_per_lineage
        merges = max(lineage_merges(layout, a.segment_id), lineage_merges(layout, b.segment_id))
        return cap is not None and merges + 1 > cap

    pairs = [
        (load(a) + load(b), a, b)
        for a, b in zip(active, active[1:], strict=False)
        if not (require_cold and capped(a, b))
    ]
    if not pairs:
        return None
    combined, a, b = min(pairs, key=lambda p: p[0])
    if require_cold and not combined < 1 / policy.scale_factor:
        return None
    return Decision("merge", (a.segment_id, b.segment_id), f"{reason}: load {combined:.2f}")
