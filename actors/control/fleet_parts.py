"""What ``SegmentFleet`` gives the parts it is made of (``RestingSegments``,
``SegmentCalls``): declared once here, so each part states only what else it uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.names import SegmentName

if TYPE_CHECKING:
    from actors.segment.handle import SegmentHandle
    from runtime.hibernation import HibernationMarks
    from storage.incarnation_storage import IncarnationStorage


class FleetParts:
    """The fleet's handles, storage and hibernation marks, as its parts see them."""

    _marks: HibernationMarks

    if TYPE_CHECKING:

        def handle(self, name: SegmentName) -> SegmentHandle: ...
        def forget(self, name: SegmentName) -> None: ...
        def storage(self) -> IncarnationStorage: ...
