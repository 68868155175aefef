"""What the cluster has free for a topic's segments, read from Ray's scheduler.

``runtime.capacity`` decides whether new segment actors fit; this module is its
one window on Ray: the free ``memory`` resource of each live node on which the
topic's placement (``runtime.placement``) lets its segments run. Ray's view
lags what was started a moment ago by up to a resource report, so two
operations racing for the last room may both pass here; Ray's scheduler, which
accounts each segment's declared memory, is then the backstop (the segment
waits for room instead of overcommitting the node).
"""

from __future__ import annotations

from collections.abc import Mapping

from ray._private import state as ray_state

from runtime.capacity import SegmentFootprint, admit
from runtime.names import TopicName
from runtime.placement import actor_resources, placement_from_env

_MEMORY = "memory"


def free_memory_per_node(topic: TopicName) -> list[float]:
    """Free memory (bytes) on each live node that may hold ``topic``'s segments."""
    wanted = actor_resources(topic, placement_from_env()) or {}
    totals = ray_state.total_resources_per_node()
    return [
        float(available.get(_MEMORY, 0.0))
        for node, available in ray_state.available_resources_per_node().items()
        if _may_hold(totals.get(node, {}), wanted)
    ]


def check_capacity(what: str, topic: TopicName, new_segments: int) -> None:
    """Refuse ``what`` (``InsufficientCapacityError``) when ``new_segments`` more
    segment actors of ``topic`` do not fit; free when nothing new starts."""
    if new_segments > 0:
        admit(what, new_segments, SegmentFootprint.from_env(), free_memory_per_node(topic))


def segment_memory() -> int:
    """The memory each segment actor declares to Ray's scheduler."""
    return SegmentFootprint.from_env().memory_bytes


def _may_hold(total: Mapping[str, float], wanted: Mapping[str, float]) -> bool:
    return all(total.get(resource, 0.0) >= amount for resource, amount in wanted.items())
