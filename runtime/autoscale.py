"""Automatic split/merge decisions: pure functions over measured segment rates.

The controller samples every active segment's end offset and size, feeds the
samples to a ``LoadTracker`` and asks ``decide`` what to do. Flapping is ruled
out three ways: a segment's rate only counts once it spans a whole window (a
new child must prove its load first); nothing happens within the cool-down
after any change; and the merge threshold sits ``scale_factor`` below the
split threshold, so a split's halves (together above target) never qualify
for a merge and a merged segment (below target / factor) never for a split.
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

    def load(self, policy: AutoscalePolicy) -> float:
        """Fraction of one segment's target (1.0 = exactly at target)."""
        loads = [0.0]
        if policy.target_msgs_per_s:
            loads.append(self.msgs_per_s / policy.target_msgs_per_s)
        if policy.target_bytes_per_s:
            loads.append(self.bytes_per_s / policy.target_bytes_per_s)
        return max(loads)


@dataclass(frozen=True)
class Decision:
    kind: Literal["split", "merge"]
    segment_ids: tuple[int, ...]
    reason: str


class LoadTracker:
    """Recent (time, records, bytes) samples per segment; rates over a window."""

    def __init__(self) -> None:
        self._samples: dict[int, deque[tuple[float, int, int]]] = {}

    def observe(self, now: float, totals: dict[int, tuple[int, int]]) -> None:
        """Record ``{segment_id: (records, bytes)}``; forget segments no longer reported."""
        for gone in set(self._samples) - set(totals):
            del self._samples[gone]
        for segment_id, (records, nbytes) in totals.items():
            self._samples.setdefault(segment_id, deque(maxlen=256)).append((now, records, nbytes))

    def rates(self, now: float, window_s: float) -> dict[int, Rate]:
        """Average rate over the last ``window_s`` for segments observed at least that long."""
        result = {}
        for segment_id, samples in self._samples.items():
            first = _oldest_within(samples, now - window_s)
            t1, r1, b1 = samples[-1]
            if first is None or t1 - first[0] <= 0:
                continue
            span = t1 - first[0]
            result[segment_id] = Rate((r1 - first[1]) / span, max(b1 - first[2], 0) / span)
        return result


def _oldest_within(samples: deque, since: float) -> tuple[float, int, int] | None:
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
) -> Decision | None:
    """At most one layout change for this round, or None."""
    if last_change_at is not None and now - last_change_at < policy.cooldown_s:
        return None
    active = list(layout.active_segments.values())  # in hash-range order
    if len(active) < policy.min_segments:
        widest = max(active, key=lambda s: s.hash_range.width)
        if widest.hash_range.width > 1:
            return Decision("split", (widest.segment_id,), "below minSegments")
    if len(active) > policy.max_segments:
        return _coldest_pair(active, rates, policy, "above maxSegments", require_cold=False)
    if any(s.segment_id not in rates for s in active):
        return None  # a segment has not been watched for a whole window yet
    if len(active) < policy.max_segments:
        hot = [s for s in active if s.hash_range.width > 1 and rates[s.segment_id].load(policy) > 1]
        if hot:
            hottest = max(hot, key=lambda s: rates[s.segment_id].load(policy))
            load = rates[hottest.segment_id].load(policy)
            return Decision("split", (hottest.segment_id,), f"load {load:.2f} x target")
    if len(active) > policy.min_segments:
        return _coldest_pair(active, rates, policy, "cold neighbours", require_cold=True)
    return None


def _coldest_pair(
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

    pairs = [(load(a) + load(b), a, b) for a, b in zip(active, active[1:], strict=False)]
    if not pairs:
        return None
    combined, a, b = min(pairs, key=lambda p: p[0])
    if require_cold and not combined < 1 / policy.scale_factor:
        return None
    return Decision("merge", (a.segment_id, b.segment_id), f"{reason}: load {combined:.2f}")
