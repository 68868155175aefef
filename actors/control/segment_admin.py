"""The internal Segments API as a topic's controller carries it out: segments made,
sealed and deleted one at a time, by an operator (``docs/reference/admin.md``).

These bypass the layout's operations, so each checks what the layout says first: a
segment named with the wrong range is not the layout's, an ACTIVE one is sealed or
deleted only when forced (producers to its range would wait for a layout change).
Who calls: the controller's entry points, under its lock, after its recovery.
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.control.topic_parts import TopicParts
from runtime.errors import ConflictError, SegmentNotFoundError
from runtime.layout import HashRange, SegmentInfo
from runtime.names import SegmentName


@dataclass(frozen=True)
class SegmentAdministration:
    parts: TopicParts

    async def create(self, name: SegmentName, subscriptions: list[str]) -> None:
        """A segment outside the layout, or the layout's own (its range must match)."""
        fleet = self.parts.fleet
        layout = self.parts.read_record().layout
        info = layout.all_segments.get(name.segment_id)
        if info is not None:
            self.in_layout(name)  # the id is taken: the range must match
        else:
            info = SegmentInfo.active(
                name.segment_id, HashRange(start=name.start, end=name.end), layout.epoch
            )
        in_layout = name.segment_id in layout.all_segments
        await fleet.create(
            name, info, subscriptions, self.parts.leader_epoch(), in_layout=in_layout
        )
        fleet.handle(name)

    async def terminate(self, name: SegmentName, force: bool) -> int:
        """Seal a segment of the layout; an ACTIVE one only with ``force``. Returns its end
        offset."""
        if self.in_layout(name).is_active and not force:
            raise ConflictError(
                f"{name} is ACTIVE in the layout of {self.parts.topic}: split or merge it to "
                "seal it with successors, or pass force=True"
            )
        return await self.parts.fleet.seal(name, self.parts.leader_epoch())

    async def delete(self, name: SegmentName, force: bool) -> None:
        """Stop and remove a segment; one of the layout's ACTIVE ones only with ``force``."""
        info = self.in_layout(name, required=False)
        if info is None:
            if self.parts.fleet.running(name) is None:
                raise SegmentNotFoundError(f"{name} does not exist")
        elif info.is_active and not force:
            raise ConflictError(
                f"{name} is ACTIVE in the layout of {self.parts.topic}: terminate it through a "
                "split/merge first, or pass force=True"
            )
        await self.parts.fleet.destroy(name, self.parts.leader_epoch())

    def in_layout(self, name: SegmentName, required: bool = True) -> SegmentInfo | None:
        """The layout's record of ``name``; its range must match the layout's."""
        topic = self.parts.topic
        info = self.parts.read_record().layout.all_segments.get(name.segment_id)
        if info is None:
            if required:
                raise SegmentNotFoundError(f"{name} is not in the layout of {topic}")
            return None
        rng = info.hash_range
        if (rng.start, rng.end) != (name.start, name.end):  # names no segment there is
            raise SegmentNotFoundError(
                f"{name} is not in the layout of {topic}: segment {name.segment_id} "
                f"is [{rng.start:04x}-{rng.end:04x}]"
            )
        return info
