"""Admission by capacity: a layout change starts segment actors only if they fit.

Every segment is a process (~85 MB on a small machine), so the number of
segments a cluster can hold is set by its memory, not by any per-topic limit: a
single request for a few thousand segments would start a few thousand
processes and take the machine down with everything on it. Each segment actor
declares what it needs to Ray (``memory``), so Ray's scheduler accounts for the
segments that run; before the controller starts new ones it compares what they
need with what the nodes that may hold them have free, and refuses up front
what does not fit. Nothing is half-created: the check comes before any write.

Pure: the caller reads the free resources from Ray (``actors.registry``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.errors import InsufficientCapacityError, InvalidArgumentError

MEMORY_ENV = "RAYTOPICS_SEGMENT_MEMORY_MB"
DEFAULT_MEMORY_MB = 96  # a segment actor's resident size here, with room for its buffers
_MIB = 1 << 20


@dataclass(frozen=True)
class SegmentFootprint:
    """What one segment actor declares to Ray's scheduler."""

    memory_bytes: int

    @classmethod
    def from_env(cls) -> SegmentFootprint:
        raw = os.environ.get(MEMORY_ENV)
        if not raw:
            return cls(DEFAULT_MEMORY_MB * _MIB)
        try:
            megabytes = int(raw)
        except ValueError:
            raise InvalidArgumentError(f"{MEMORY_ENV} must be an integer, got {raw!r}") from None
        if megabytes < 1:
            raise InvalidArgumentError(f"{MEMORY_ENV} must be >= 1, got {megabytes}")
        return cls(megabytes * _MIB)

    def fitting(self, free_per_node: Sequence[float]) -> int:
        """How many more segments fit on nodes with ``free_per_node`` bytes free: an
        actor lives on one node, so what is left over on each node does not add up."""
        return sum(max(0, int(free // self.memory_bytes)) for free in free_per_node)


def admit(
    what: str, new_segments: int, footprint: SegmentFootprint, free_per_node: Sequence[float]
) -> None:
    """Refuse ``what`` (e.g. "creating topic://a/b/c") when its ``new_segments`` segment
    actors do not fit on the nodes that may hold them (``free_per_node``: each one's free
    memory), naming what was asked, what one segment needs and what is free."""
    fitting = footprint.fitting(free_per_node)
    if new_segments <= fitting:
        return
    free = sum(max(0.0, f) for f in free_per_node)
    one = len(free_per_node) == 1
    nodes = f"{len(free_per_node)} node{'' if one else 's'} that may hold them "
    nodes += "has" if one else "have"
    raise InsufficientCapacityError(
        f"{what} needs {new_segments} new segment actors of {_size(footprint.memory_bytes)} "
        f"each ({_size(new_segments * footprint.memory_bytes)}), but the {nodes} "
        f"{_size(free)} free: {fitting} more fit. Add nodes, delete or merge "
        f"segments, or lower {MEMORY_ENV} if segments really need less"
    )


def _size(num_bytes: float) -> str:
    if num_bytes >= 1 << 30:
        return f"{num_bytes / (1 << 30):.1f} GiB"
    return f"{num_bytes / _MIB:.0f} MiB"
